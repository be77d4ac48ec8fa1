//! Compiles the c10d shim (csrc/c10d_shim.cpp) against the libtorch that torch-sys found and
//! links it with an rpath, so `tchrun-worker` runs without LD_LIBRARY_PATH.
use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=csrc/c10d_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/c10d_shim.h");
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
    let cuda_inc = site.join("nvidia/cu13/include");
    let nccl_inc = site.join("nvidia/nccl/include");
    let with_nccl = env::var_os("TCHRUN_NO_NCCL").is_none()
        && cuda_inc.join("cuda_runtime_api.h").exists()
        && cuda_inc.join("crt/host_config.h").exists()
        && nccl_inc.join("nccl.h").exists()
        && lib.join("libtorch_cuda.so").exists();

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("/usr/include") // Debian libgloo-dev: gloo headers the wheel does not ship
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .define("USE_C10D_GLOO", None)
        .warnings(false)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations");
    if with_nccl {
        build
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("TCHRUN_WITH_NCCL", None)
            .include(&cuda_inc)
            .include(&nccl_inc);
    } else {
        println!(
            "cargo:warning=building without ProcessGroupNCCL (CUDA/NCCL headers not found under {}); \
             pip install nvidia-cuda-crt==13.0.* nvidia-cuda-cccl==13.0.* to enable it",
            site.display()
        );
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
    if with_nccl {
        // --no-as-needed: libtorch_cuda must be loaded for CUDA to be visible at run time.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
