//! The command the training report prints to open a job's TensorBoard events: one that runs on
//! this machine. `tensorboard` on PATH; else the one in a virtual environment (`$VIRTUAL_ENV`,
//! `./.venv`, or the `.venv` of a folder above tchrun's binary, where `scripts/setup.sh` puts
//! it); else that venv's Python with the package (`python -m tensorboard.main`); else the plain
//! command with how to install it. Looks at files only: nothing is run.
use std::path::{Path, PathBuf};

/// How many folders above tchrun's binary may hold the `.venv` (`<repo>/target/release/tchrun`
/// is three below `<repo>`).
const VENV_LEVELS: usize = 4;

/// The command that shows the events in `logdir`, from this process's PATH and surroundings.
pub fn command(logdir: &Path) -> String {
    let path: Vec<PathBuf> = std::env::var_os(tchrun::env::PATH)
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os(tchrun::env::VIRTUAL_ENV) {
        venvs.push(PathBuf::from(v));
    }
    if let Ok(cwd) = std::env::current_dir() {
        venvs.push(cwd.join(".venv"));
    }
    if let Ok(exe) = std::env::current_exe() {
        venvs.extend(
            exe.ancestors()
                .skip(1)
                .take(VENV_LEVELS)
                .map(|d| d.join(".venv")),
        );
    }
    command_with(logdir, &path, &venvs)
}

/// [`command`] with the PATH folders and the candidate venvs given.
pub fn command_with(logdir: &Path, path: &[PathBuf], venvs: &[PathBuf]) -> String {
    let q = |p: &Path| shell_words::quote(&p.display().to_string()).into_owned();
    let logdir = q(logdir);
    if path
        .iter()
        .any(|d| tchrun::files::is_executable(&d.join("tensorboard")))
    {
        return format!("tensorboard --logdir {logdir}");
    }
    if let Some(tb) = venvs
        .iter()
        .map(|v| v.join("bin/tensorboard"))
        .find(|t| tchrun::files::is_executable(t))
    {
        return format!("{} --logdir {logdir}", q(&tb));
    }
    if let Some(py) = venvs
        .iter()
        .filter(|v| has_package(v, "tensorboard"))
        .map(|v| v.join("bin/python"))
        .find(|p| tchrun::files::is_executable(p))
    {
        return format!("{} -m tensorboard.main --logdir {logdir}", q(&py));
    }
    format!(
        "tensorboard --logdir {logdir} (no tensorboard on PATH or in a virtual environment \
         here: pip install tensorboard)"
    )
}

/// Whether the venv `venv` has the package `name` (`lib/python3.*/site-packages/<name>/`).
fn has_package(venv: &Path, name: &str) -> bool {
    std::fs::read_dir(venv.join("lib")).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.path().join("site-packages").join(name).is_dir())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executable(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    #[test]
    fn the_printed_command_is_one_that_exists_here() {
        let t = tempfile::tempdir().expect("tempdir");
        let (bin, venv) = (t.path().join("bin"), t.path().join("venv"));
        let logs = Path::new("/o/tensorboard");
        let none = command_with(logs, &[bin.clone()], &[venv.clone()]);
        assert!(
            none.starts_with("tensorboard --logdir /o/tensorboard (no tensorboard on PATH"),
            "{none}"
        );
        executable(&venv.join("bin/python"));
        std::fs::create_dir_all(venv.join("lib/python3.11/site-packages/tensorboard"))
            .expect("mkdir");
        assert_eq!(
            command_with(logs, &[bin.clone()], &[venv.clone()]),
            format!(
                "{}/bin/python -m tensorboard.main --logdir /o/tensorboard",
                venv.display()
            )
        );
        executable(&venv.join("bin/tensorboard"));
        assert_eq!(
            command_with(Path::new("/my runs/tb"), &[bin.clone()], &[venv.clone()]),
            format!("{}/bin/tensorboard --logdir '/my runs/tb'", venv.display())
        );
        executable(&bin.join("tensorboard"));
        assert_eq!(
            command_with(logs, &[bin], &[venv]),
            "tensorboard --logdir /o/tensorboard"
        );
    }
}
