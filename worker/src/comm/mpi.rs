//! Open MPI, loaded when a rank was started under MPI and never otherwise: `tchrun-worker` has
//! no `NEEDED` entry for libmpi, so `--launcher local`, `srun --mpi=none` and torchrun-style
//! starts run on a machine with no MPI at all, and a rank started by `mpirun` uses the Open MPI
//! found at run time (4.x and 5.x share `libmpi.so.40` and its ABI). Only the calls the
//! bootstrap needs: init, rank and size, the node-local communicator, broadcast and
//! all-gather of bytes, finalize (when the `Universe` is dropped).
//!
//! Where libmpi is looked for (`tchrun::openmpi::libmpi_candidates`, the launcher's
//! pre-flight uses the same list): the dynamic loader's own search (`LD_LIBRARY_PATH`, which
//! `module load openmpi` sets, then the system's), `$OPAL_PREFIX/lib`, then beside the
//! `mpirun` on `PATH`.
use libloading::os::unix::{Library, Symbol, RTLD_GLOBAL, RTLD_NOW};
use std::ffi::{c_int, c_void};
use tchrun::openmpi;

/// Open MPI's handles are pointers to its predefined objects (`MPI_COMM_WORLD` is
/// `&ompi_mpi_comm_world`, `MPI_BYTE` is `&ompi_mpi_byte`).
type Handle = *mut c_void;

/// `MPI_COMM_TYPE_SHARED` (the first of Open MPI's split types in 4.x and 5.x).
const COMM_TYPE_SHARED: c_int = 0;
const SUCCESS: c_int = 0;

/// libmpi could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    #[error(
        "this rank was started under MPI but Open MPI's libmpi.so.40 cannot be loaded ({tried}); \
         fix: `module load openmpi` (or set LD_LIBRARY_PATH to Open MPI's lib folder) on every \
         node, or start the job with --launcher local / srun --mpi=none"
    )]
    NotFound { tried: String },
    #[error("{lib} lacks {symbol} (not Open MPI 4.x/5.x?): {message}")]
    Symbol {
        lib: String,
        symbol: &'static str,
        message: String,
    },
    #[error(
        "MPI could not be initialized (was this process started by mpirun or srun --mpi=pmix?)"
    )]
    Init,
    #[error("{call} failed with MPI error {code}")]
    Call { call: &'static str, code: c_int },
}

type CommQuery = unsafe extern "C" fn(Handle, *mut c_int) -> c_int;

/// The functions and predefined handles used, resolved once.
struct Api {
    init: unsafe extern "C" fn(*mut c_int, *mut *mut *mut i8) -> c_int,
    initialized: unsafe extern "C" fn(*mut c_int) -> c_int,
    finalize: unsafe extern "C" fn() -> c_int,
    comm_rank: CommQuery,
    comm_size: CommQuery,
    split_type: unsafe extern "C" fn(Handle, c_int, c_int, Handle, *mut Handle) -> c_int,
    comm_free: unsafe extern "C" fn(*mut Handle) -> c_int,
    bcast: unsafe extern "C" fn(*mut c_void, c_int, Handle, c_int, Handle) -> c_int,
    allgather: unsafe extern "C" fn(
        *const c_void,
        c_int,
        Handle,
        *mut c_void,
        c_int,
        Handle,
        Handle,
    ) -> c_int,
    world: Handle,
    byte: Handle,
    info_null: Handle,
}

/// MPI, initialized; dropping it finalizes MPI (hold it for the whole run).
pub struct Universe {
    api: Api,
    /// Keeps libmpi loaded while `api` points into it.
    _lib: Library,
}

/// A communicator of a `Universe`.
pub struct Comm<'u> {
    api: &'u Api,
    handle: Handle,
    /// Freed on drop (not `MPI_COMM_WORLD`).
    owned: bool,
}

fn check(call: &'static str, code: c_int) -> Result<(), MpiError> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(MpiError::Call { call, code })
    }
}

fn open() -> Result<(Library, String), MpiError> {
    let get = |k: &str| std::env::var_os(k);
    let mut tried = Vec::new();
    for cand in openmpi::libmpi_candidates(&get) {
        // RTLD_GLOBAL: Open MPI's plugins resolve libmpi's symbols through the global scope.
        match unsafe { Library::open(Some(&cand), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => return Ok((lib, cand.to_string_lossy().into_owned())),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(MpiError::NotFound {
        tried: tried.join("; "),
    })
}

impl Api {
    fn resolve(lib: &Library, name: &str) -> Result<Api, MpiError> {
        fn sym<T: Copy>(lib: &Library, name: &str, s: &'static str) -> Result<T, MpiError> {
            let c = format!("{s}\0");
            let f: Symbol<T> = unsafe { lib.get(c.as_bytes()) }.map_err(|e| MpiError::Symbol {
                lib: name.into(),
                symbol: s,
                message: e.to_string(),
            })?;
            Ok(*f)
        }
        // A data symbol's address is the handle.
        let data = |s: &'static str| sym::<Handle>(lib, name, s);
        Ok(Api {
            init: sym(lib, name, "MPI_Init")?,
            initialized: sym(lib, name, "MPI_Initialized")?,
            finalize: sym(lib, name, "MPI_Finalize")?,
            comm_rank: sym(lib, name, "MPI_Comm_rank")?,
            comm_size: sym(lib, name, "MPI_Comm_size")?,
            split_type: sym(lib, name, "MPI_Comm_split_type")?,
            comm_free: sym(lib, name, "MPI_Comm_free")?,
            bcast: sym(lib, name, "MPI_Bcast")?,
            allgather: sym(lib, name, "MPI_Allgather")?,
            world: data("ompi_mpi_comm_world")?,
            byte: data("ompi_mpi_byte")?,
            info_null: data("ompi_mpi_info_null")?,
        })
    }
}

impl Universe {
    /// Loads libmpi and initializes MPI. `Init` when MPI was initialized already or
    /// `MPI_Init` failed.
    pub fn initialize() -> Result<Universe, MpiError> {
        let (lib, name) = open()?;
        let api = Api::resolve(&lib, &name)?;
        tracing::debug!("MPI: {name}");
        let mut already: c_int = 0;
        check("MPI_Initialized", unsafe {
            (api.initialized)(&mut already)
        })?;
        if already != 0 {
            return Err(MpiError::Init);
        }
        let code = unsafe { (api.init)(std::ptr::null_mut(), std::ptr::null_mut()) };
        if code != SUCCESS {
            return Err(MpiError::Init);
        }
        Ok(Universe { api, _lib: lib })
    }

    /// `MPI_COMM_WORLD`.
    pub fn world(&self) -> Comm<'_> {
        Comm {
            api: &self.api,
            handle: self.api.world,
            owned: false,
        }
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        unsafe { (self.api.finalize)() };
    }
}

fn len(n: usize) -> Result<c_int, MpiError> {
    c_int::try_from(n).map_err(|_| MpiError::Call {
        call: "a buffer over 2 GiB",
        code: -1,
    })
}

impl Comm<'_> {
    fn query(&self, f: CommQuery, call: &'static str) -> Result<usize, MpiError> {
        let mut v: c_int = 0;
        check(call, unsafe { f(self.handle, &mut v) })?;
        Ok(v.max(0) as usize)
    }

    pub fn rank(&self) -> Result<usize, MpiError> {
        self.query(self.api.comm_rank, "MPI_Comm_rank")
    }

    pub fn size(&self) -> Result<usize, MpiError> {
        self.query(self.api.comm_size, "MPI_Comm_size")
    }

    /// The ranks that share this rank's node (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`,
    /// ordered by their rank here). Collective.
    pub fn split_shared(&self, key: usize) -> Result<Comm<'_>, MpiError> {
        let mut out: Handle = std::ptr::null_mut();
        let key = len(key)?;
        check("MPI_Comm_split_type", unsafe {
            (self.api.split_type)(
                self.handle,
                COMM_TYPE_SHARED,
                key,
                self.api.info_null,
                &mut out,
            )
        })?;
        Ok(Comm {
            api: self.api,
            handle: out,
            owned: true,
        })
    }

    /// `buf` from `root` on every rank. Collective; every rank passes the same length.
    pub fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<(), MpiError> {
        let n = len(buf.len())?;
        let root = len(root)?;
        check("MPI_Bcast", unsafe {
            (self.api.bcast)(buf.as_mut_ptr().cast(), n, self.api.byte, root, self.handle)
        })
    }

    /// Every rank's `mine` in rank order into `all` (`mine.len() × size` bytes). Collective.
    pub fn all_gather(&self, mine: &[u8], all: &mut [u8]) -> Result<(), MpiError> {
        let n = len(mine.len())?;
        if all.len() != mine.len() * self.size()? {
            return Err(MpiError::Call {
                call: "MPI_Allgather (receive buffer of the wrong size)",
                code: -1,
            });
        }
        let b = self.api.byte;
        check("MPI_Allgather", unsafe {
            (self.api.allgather)(
                mine.as_ptr().cast(),
                n,
                b,
                all.as_mut_ptr().cast(),
                n,
                b,
                self.handle,
            )
        })
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        if self.owned {
            unsafe { (self.api.comm_free)(&mut self.handle) };
        }
    }
}
