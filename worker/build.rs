//! Compiles the c10d shim (csrc/c10d_shim.cpp) against the libtorch that torch-sys found and
//! links it with an rpath, so `tchrun-worker` runs without LD_LIBRARY_PATH.
//!
//! CUDA: whenever the wheel ships `libtorch_cuda.so`, the worker links it unconditionally
//! (one `-Wl,--no-as-needed,-ltorch_cuda,--as-needed` argument: rustc puts separate link
//! arguments after every library, where a lone `--no-as-needed` wraps nothing), so CUDA is
//! visible at run time whether or not the NCCL part of the shim is compiled. The NCCL part
//! needs the CUDA runtime and NCCL headers; when `libtorch_cuda.so` exists but they cannot be
//! found the build fails with the fix, unless `TCHRUN_NO_NCCL=1` asks for a Gloo-only build.
use std::env;
use std::path::{Path, PathBuf};

/// The headers the NCCL part of the shim includes from the CUDA toolkit.
const CUDA_RUNTIME_HEADER: &str = "cuda_runtime_api.h";
const CUDA_CRT_HEADER: &str = "crt/host_config.h";
const NCCL_HEADER: &str = "nccl.h";

/// `TCHRUN_NO_NCCL` set to anything but "" or "0".
fn no_nccl_requested() -> bool {
    matches!(env::var("TCHRUN_NO_NCCL"), Ok(v) if !v.trim().is_empty() && v.trim() != "0")
}

/// `$VAR/include` when the variable is set.
fn env_include(var: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={var}");
    env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(|v| PathBuf::from(v).join("include"))
}

/// Where the CUDA runtime headers may be: the wheels' `nvidia/cu*/include` (CUDA 13 layout;
/// newest first), `nvidia/cuda_runtime/include` (CUDA 12 layout), then a toolkit.
fn cuda_candidates(site: &Path) -> Vec<PathBuf> {
    let mut cu: Vec<PathBuf> = std::fs::read_dir(site.join("nvidia"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    n.starts_with("cu") && n[2..].chars().all(|c| c.is_ascii_digit()) && n.len() > 2
                })
                .map(|e| e.path().join("include"))
                .collect()
        })
        .unwrap_or_default();
    // cu13 before cu12; numeric, so cu100 would sort after cu13.
    cu.sort_by_key(|p| {
        std::cmp::Reverse(
            p.parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_string_lossy()[2..].parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    let mut c = cu;
    c.push(site.join("nvidia/cuda_runtime/include"));
    c.extend(env_include("CUDA_HOME"));
    c.extend(env_include("CUDA_PATH"));
    c.push(PathBuf::from("/usr/local/cuda/include"));
    c
}

fn nccl_candidates(site: &Path) -> Vec<PathBuf> {
    let mut c = vec![site.join("nvidia/nccl/include")];
    c.extend(env_include("NCCL_HOME"));
    c
}

/// The include directories the NCCL part needs, or what is missing and where it was looked for.
fn find_nccl_includes(site: &Path) -> Result<Vec<PathBuf>, String> {
    let cuda = cuda_candidates(site);
    let nccl = nccl_candidates(site);
    let has = |d: &PathBuf, h: &str| d.join(h).is_file();
    // Prefer one directory with both CUDA headers; else the runtime and crt headers from two
    // (CUDA 12 wheels put crt/ in another package).
    let cuda_dirs: Option<Vec<PathBuf>> = cuda
        .iter()
        .find(|d| has(d, CUDA_RUNTIME_HEADER) && has(d, CUDA_CRT_HEADER))
        .map(|d| vec![d.clone()])
        .or_else(|| {
            let rt = cuda.iter().find(|d| has(d, CUDA_RUNTIME_HEADER))?;
            let crt = cuda.iter().find(|d| has(d, CUDA_CRT_HEADER))?;
            Some(vec![rt.clone(), crt.clone()])
        });
    let nccl_dir = nccl.iter().find(|d| has(d, NCCL_HEADER));
    let show = |v: &[PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut missing = Vec::new();
    if cuda_dirs.is_none() {
        let absent: Vec<&str> = [CUDA_RUNTIME_HEADER, CUDA_CRT_HEADER]
            .into_iter()
            .filter(|h| !cuda.iter().any(|d| has(d, h)))
            .collect();
        let absent = if absent.is_empty() {
            format!("{CUDA_RUNTIME_HEADER} and {CUDA_CRT_HEADER} together")
        } else {
            absent.join(" and ")
        };
        missing.push(format!("{absent} (looked in {})", show(&cuda)));
    }
    if nccl_dir.is_none() {
        missing.push(format!("{NCCL_HEADER} (looked in {})", show(&nccl)));
    }
    match (cuda_dirs, nccl_dir) {
        (Some(mut dirs), Some(n)) => {
            dirs.push(n.clone());
            Ok(dirs)
        }
        _ => Err(missing.join("; ")),
    }
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/c10d_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/c10d_shim.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=TCHRUN_NO_NCCL");
    let lib = match env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(v) => PathBuf::from(v),
        Err(_) => panic!(
            "torch-sys did not report its libtorch directory (DEP_TCH_LIBTORCH_LIB); \
             run scripts/setup.sh so that .venv/libtorch exists, or set LIBTORCH"
        ),
    };
    let lib = lib.canonicalize().unwrap_or(lib);
    let torch_dir = lib
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| lib.clone());
    let include = torch_dir.join("include");
    let site = torch_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| torch_dir.clone());
    let torch_cuda = lib.join("libtorch_cuda.so");
    let has_cuda = torch_cuda.is_file();
    let nccl_includes = if !has_cuda {
        println!(
            "cargo:warning=building without CUDA: {} does not exist (a CPU-only libtorch)",
            torch_cuda.display()
        );
        None
    } else if no_nccl_requested() {
        println!(
            "cargo:warning=TCHRUN_NO_NCCL is set: building without ProcessGroupNCCL (Gloo only); \
             CUDA is still linked; CUDA jobs then need --backend gloo"
        );
        None
    } else {
        match find_nccl_includes(&site) {
            Ok(dirs) => Some(dirs),
            Err(missing) => panic!(
                "\n\nlibtorch ships CUDA ({}) but the NCCL process group cannot be compiled: \
                 missing {missing}.\n\
                 Fix: run scripts/setup.sh, which installs nvidia-cuda-crt==13.0.* and \
                 nvidia-cuda-cccl==13.0.* (scripts/requirements.txt) beside the torch wheel; or \
                 set CUDA_HOME / NCCL_HOME to a toolkit and NCCL matching the wheel; or set \
                 TCHRUN_NO_NCCL=1 to build a Gloo-only worker knowingly.\n\n",
                torch_cuda.display()
            ),
        }
    };

    let manifest = env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("/usr/include") // Debian libgloo-dev: gloo headers the wheel does not ship
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // No path of this machine in the binary (`__FILE__` of torch's checks, the shim's):
        // an installed worker must name none (scripts/wheel.sh checks).
        .flag(format!("-ffile-prefix-map={}=torch", torch_dir.display()))
        .flag(format!("-ffile-prefix-map={manifest}=worker"))
        .define("USE_C10D_GLOO", None)
        .warnings(false)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations");
    if let Some(dirs) = &nccl_includes {
        build
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("TCHRUN_WITH_NCCL", None);
        for d in dirs {
            build.include(d);
        }
    }
    build.compile("tchrun_c10d_shim");

    // The torch version for the driver-log header.
    let version = std::fs::read_to_string(torch_dir.join("version.py"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("__version__ = ")
                    .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TCHRUN_TORCH_VERSION={version}");
    println!(
        "cargo:rerun-if-changed={}",
        torch_dir.join("version.py").display()
    );

    println!("cargo:rustc-link-search=native={}", lib.display());
    if has_cuda {
        // One argument, so the pair wraps the library: libtorch_cuda must be loaded for CUDA
        // to be visible at run time, even when no symbol of it is referenced.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
