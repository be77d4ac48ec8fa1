//! The seed corpus: real `torch.save` archives written by the venv's torch and torchvision
//! (`make_seeds.py`), once per test binary. Like the repository's other tests that need
//! Python, this one fails when the venv (made by scripts/setup.sh) cannot run it.
use crate::mutate::Seed;
use std::path::Path;
use std::sync::OnceLock;

pub fn corpus() -> &'static [Seed] {
    static SEEDS: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = here.join("../../.venv/bin/python");
        let dir = std::env::temp_dir().join(format!("tchrun-fuzz-seeds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let out = std::process::Command::new(&python)
            .arg(here.join("tests/fuzz/make_seeds.py"))
            .arg(&dir)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (make the venv: scripts/setup.sh)",
                    python.display()
                )
            });
        assert!(
            out.status.success(),
            "make_seeds.py failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .expect("the seeds' directory")
            .map(|e| e.expect("a seed").path())
            .collect();
        names.sort();
        let seeds: Vec<Seed> = names
            .iter()
            .map(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                Seed::new(
                    name.unwrap_or_default(),
                    std::fs::read(p).expect("a seed file"),
                )
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            seeds.len() >= 5,
            "make_seeds.py wrote {} files",
            seeds.len()
        );
        seeds
    })
}
