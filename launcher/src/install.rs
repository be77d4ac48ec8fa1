//! Where an installed `tchrun-worker` finds libtorch: the `torch` package of the environment it
//! was installed into (the wheel puts both binaries in the environment's `bin/`; venvs and
//! conda environments alike keep packages in `lib/pythonX.Y/site-packages`). The wheel's
//! `$ORIGIN`-relative RUNPATH is `runpath()`; the launcher's pre-flight reads the same places
//! (`env_torch`) and refuses a torch of another series before any rank starts, where the
//! dynamic loader would otherwise fail with a missing library or symbol.

use std::path::{Path, PathBuf};

/// The torch series the binaries are built for (tch 0.24 binds libtorch 2.11's API).
pub const TORCH_SERIES: &str = "2.11";

/// The Python versions torch 2.11 ships wheels for, in RUNPATH order (`t`: free-threaded).
pub const PYTHONS: &[&str] = &["3.10", "3.11", "3.12", "3.13", "3.14", "3.13t", "3.14t"];

/// `torch/lib` of an environment, relative to its `bin/`, one per Python version.
pub fn torch_lib_dirs() -> Vec<String> {
    PYTHONS
        .iter()
        .map(|v| format!("../lib/python{v}/site-packages/torch/lib"))
        .collect()
}

/// The RUNPATH of an installed binary (`patchelf --set-rpath`): `$ORIGIN/` + each of
/// `torch_lib_dirs`, colon-separated.
pub fn runpath() -> String {
    torch_lib_dirs()
        .iter()
        .map(|d| format!("$ORIGIN/{d}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What the environment of a `bin/` folder holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvTorch {
    /// Not an environment (no `../lib/python3.*`): a build tree, whose binaries carry an
    /// absolute RUNPATH; nothing to check.
    NotAnEnv,
    /// The first `torch/lib` of `torch_lib_dirs` that holds libtorch, and its version.
    Found { dir: PathBuf, version: String },
    /// An environment without torch.
    Missing { env: PathBuf },
    /// A venv without torch of its own that sees another environment's packages
    /// (`python -m venv --system-site-packages`): the torch `import torch` finds is in `base`,
    /// out of reach of the binaries' `$ORIGIN`-relative RUNPATH.
    SeesSystem { env: PathBuf, base: String },
}

/// The torch the binaries in `bin` load, as the dynamic loader would pick it.
pub fn env_torch(bin: &Path) -> EnvTorch {
    let Some(env) = bin.parent() else {
        return EnvTorch::NotAnEnv;
    };
    let has_python = std::fs::read_dir(env.join("lib"))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("python3"))
        })
        .unwrap_or(false);
    if !has_python {
        return EnvTorch::NotAnEnv;
    }
    for d in torch_lib_dirs() {
        let lib = bin.join(&d);
        if lib.join("libtorch_cpu.so").is_file() {
            let torch = lib.parent().map(Path::to_path_buf).unwrap_or(lib.clone());
            let version = std::fs::read_to_string(torch.join("version.py"))
                .ok()
                .and_then(|t| version_of(&t))
                .unwrap_or_else(|| "unknown".into());
            return EnvTorch::Found {
                dir: normalize(&torch),
                version,
            };
        }
    }
    match system_site_packages(env) {
        Some(base) => EnvTorch::SeesSystem {
            env: env.to_path_buf(),
            base,
        },
        None => EnvTorch::Missing {
            env: env.to_path_buf(),
        },
    }
}

/// The base Python's `home` of a venv made with `--system-site-packages` (its `pyvenv.cfg`
/// says `include-system-site-packages = true`); None for any other environment.
fn system_site_packages(env: &Path) -> Option<String> {
    let cfg = std::fs::read_to_string(env.join("pyvenv.cfg")).ok()?;
    let value = |key: &str| {
        cfg.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    match value("include-system-site-packages")?
        .to_ascii_lowercase()
        .as_str()
    {
        "true" => Some(value("home").unwrap_or_else(|| "the base Python".into())),
        _ => None,
    }
}

/// `bin/../lib/...` without the `..` (for messages).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `__version__` of torch's `version.py`.
pub fn version_of(version_py: &str) -> Option<String> {
    version_py.lines().find_map(|l| {
        l.strip_prefix("__version__ = ")
            .map(|v| v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
    })
}

/// Whether `version` (e.g. `2.11.0+cu130`) is of `TORCH_SERIES`.
pub fn is_supported(version: &str) -> bool {
    let mut parts = version.split('.');
    let series = TORCH_SERIES.split('.');
    series.into_iter().all(|s| parts.next() == Some(s))
}

/// The environment's torch cannot serve these binaries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TorchMismatch {
    #[error(
        "tchrun {tchrun} is built for torch {TORCH_SERIES} but this environment has torch {found} \
         ({dir}); fix: `pip install 'torch=={TORCH_SERIES}.*'` in this environment, or install \
         tchrun into an environment with torch {TORCH_SERIES}",
        tchrun = tchrun::VERSION,
        dir = dir.display()
    )]
    Version { found: String, dir: PathBuf },
    #[error(
        "tchrun-worker needs {lib}, which torch {version} in {dir} lacks (a CPU-only build of \
         torch?); fix: `pip install 'torch=={TORCH_SERIES}.*'` from PyPI's default index (its \
         Linux wheel has CUDA and runs on CPU too), or build tchrun against this torch \
         (docs/setup.md)",
        dir = dir.display()
    )]
    Variant {
        lib: String,
        version: String,
        dir: PathBuf,
    },
    #[error(
        "no torch in the environment {env} (tchrun-worker loads libtorch from \
         lib/pythonX.Y/site-packages/torch/lib there); fix: `pip install 'torch=={TORCH_SERIES}.*'` \
         in this environment",
        env = env.display()
    )]
    Missing { env: PathBuf },
    #[error(
        "the venv {env} has no torch of its own: it sees the packages of the Python in {base} \
         (include-system-site-packages = true in its pyvenv.cfg), whose torch tchrun-worker \
         cannot load from this venv's bin/ (it loads lib/pythonX.Y/site-packages/torch/lib of \
         its own environment, without LD_LIBRARY_PATH); fix: `pip install 'torch=={TORCH_SERIES}.*'` \
         in this venv, or install tchrun into the environment that holds torch",
        env = env.display()
    )]
    SeesSystem { env: PathBuf, base: String },
}

/// `Ok` when `worker`, installed in an environment's `bin/`, will load a torch of
/// `TORCH_SERIES` that has every torch library it needs (a worker built against the CUDA wheel
/// needs `libtorch_cuda.so`, which a CPU-only torch lacks); also `Ok` when it is not installed
/// in an environment.
pub fn check(worker: &Path) -> Result<(), TorchMismatch> {
    let Some(bin) = worker.parent() else {
        return Ok(());
    };
    match env_torch(bin) {
        EnvTorch::NotAnEnv => Ok(()),
        EnvTorch::Found { version, dir } if is_supported(&version) => {
            let needed = needed(worker).unwrap_or_default();
            match needed
                .into_iter()
                .filter(|l| l.starts_with("libtorch") || l.starts_with("libc10"))
                .find(|l| !dir.join("lib").join(l).is_file())
            {
                None => Ok(()),
                Some(lib) => Err(TorchMismatch::Variant { lib, version, dir }),
            }
        }
        EnvTorch::Found { version, dir } => Err(TorchMismatch::Version {
            found: version,
            dir,
        }),
        EnvTorch::Missing { env } => Err(TorchMismatch::Missing { env }),
        EnvTorch::SeesSystem { env, base } => Err(TorchMismatch::SeesSystem { env, base }),
    }
}

/// The `DT_NEEDED` libraries of an ELF64 little-endian file (what `readelf -d` lists), read
/// from its section headers, `.dynamic` and the string table it links.
pub fn needed(path: &Path) -> std::io::Result<Vec<String>> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)?;
    let read = |off: u64, len: usize| -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, off)?;
        Ok(b)
    };
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u64;
    let u32_at =
        |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4])) as u64;
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let h = read(0, 64)?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "not a 64-bit little-endian ELF file",
        ));
    }
    let (shoff, shentsize, shnum) = (u64_at(&h, 0x28), u16_at(&h, 0x3a), u16_at(&h, 0x3c));
    if shentsize < 64 || shnum > 4096 {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "unexpected section headers",
        ));
    }
    let sections = read(shoff, (shentsize * shnum) as usize)?;
    let section = |i: u64| {
        let s = &sections[(i * shentsize) as usize..];
        // (type, offset, size, link)
        (u32_at(s, 4), u64_at(s, 24), u64_at(s, 32), u32_at(s, 40))
    };
    const SHT_DYNAMIC: u64 = 6;
    const DT_NEEDED: u64 = 1;
    const LIMIT: u64 = 16 << 20;
    let Some((_, off, size, link)) = (0..shnum).map(section).find(|s| s.0 == SHT_DYNAMIC) else {
        return Ok(Vec::new());
    };
    let (_, str_off, str_size, _) = section(link.min(shnum.saturating_sub(1)));
    let dynamic = read(off, size.min(LIMIT) as usize)?;
    let strings = read(str_off, str_size.min(LIMIT) as usize)?;
    Ok(dynamic
        .chunks_exact(16)
        .map(|e| (u64_at(e, 0), u64_at(e, 8)))
        .take_while(|(tag, _)| *tag != 0)
        .filter(|(tag, _)| *tag == DT_NEEDED)
        .filter_map(|(_, at)| {
            let s = strings.get(at as usize..)?;
            let end = s.iter().position(|b| *b == 0)?;
            Some(String::from_utf8_lossy(&s[..end]).into_owned())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(version: Option<&str>, py: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("bin")).unwrap();
        let site = t.path().join(format!("lib/python{py}/site-packages"));
        std::fs::create_dir_all(&site).unwrap();
        if let Some(v) = version {
            std::fs::create_dir_all(site.join("torch/lib")).unwrap();
            std::fs::write(site.join("torch/lib/libtorch_cpu.so"), b"").unwrap();
            std::fs::write(
                site.join("torch/version.py"),
                format!("from typing import Optional\n__version__ = '{v}'\ngit_version = 'x'\n"),
            )
            .unwrap();
        }
        t
    }

    #[test]
    fn versions_of_the_series() {
        assert!(is_supported("2.11.0"));
        assert!(is_supported("2.11.0+cu130"));
        assert!(is_supported("2.11.1+cpu"));
        assert!(!is_supported("2.1.0"));
        assert!(!is_supported("2.10.0"));
        assert!(!is_supported("2.110.0"));
        assert!(!is_supported("unknown"));
    }

    #[test]
    fn the_environments_torch_is_checked() {
        let ok = env_with(Some("2.11.0+cu130"), "3.12");
        assert_eq!(check(&ok.path().join("bin/tchrun-worker")), Ok(()));
        let old = env_with(Some("2.10.0"), "3.11");
        let e = check(&old.path().join("bin/tchrun-worker")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("torch 2.10.0") && text.contains("torch==2.11.*"),
            "{text}"
        );
        assert!(!text.contains(".."), "{text}");
        let none = env_with(None, "3.10");
        assert!(matches!(
            check(&none.path().join("bin/tchrun-worker")),
            Err(TorchMismatch::Missing { .. })
        ));
        // A venv made with --system-site-packages: named as such, with the base Python.
        std::fs::write(
            none.path().join("pyvenv.cfg"),
            "home = /opt/py/bin\ninclude-system-site-packages = true\nversion = 3.10.4\n",
        )
        .unwrap();
        let e = check(&none.path().join("bin/tchrun-worker")).unwrap_err();
        assert!(
            matches!(&e, TorchMismatch::SeesSystem { base, .. } if base == "/opt/py/bin"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("include-system-site-packages"),
            "{e}"
        );
        // A build tree: no lib/python3.* beside bin/.
        let tree = tempfile::tempdir().unwrap();
        assert_eq!(check(&tree.path().join("release/tchrun-worker")), Ok(()));
    }

    #[test]
    fn needed_reads_what_readelf_lists() {
        let me = std::env::current_exe().unwrap();
        let libs = needed(&me).unwrap();
        assert!(libs.iter().any(|l| l.starts_with("libc.so")), "{libs:?}");
        let not_elf = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(not_elf.path(), [0u8; 128]).unwrap();
        assert!(needed(not_elf.path()).is_err());
    }

    #[test]
    fn the_runpath_covers_every_python() {
        let r = runpath();
        assert!(r.starts_with("$ORIGIN/../lib/python3.10/site-packages/torch/lib:"));
        assert_eq!(r.split(':').count(), PYTHONS.len());
    }
}
