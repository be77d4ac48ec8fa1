//! PyTorch `.pth`/`.pt` files read without libtorch or Python: what `torch.save(model.
//! state_dict(), PATH)` writes (the zip archive, torch's default since 1.6: `ARCHIVE/data.pkl`
//! a pickle, `ARCHIVE/data/<key>` the raw little-endian storages), torchvision's downloaded
//! checkpoints included.
//!
//! `data.pkl` is read by a restricted unpickler: a reader, not an interpreter. It builds only
//! dicts (`OrderedDict` too, with the `_metadata` that `state_dict()` sets), lists, tuples,
//! strings, numbers, booleans, `None` and tensors (`torch._utils._rebuild_tensor_v2`/`_v3`,
//! `_rebuild_parameter`, storages from persistent ids). Every other global (`posix.system`,
//! `builtins.eval`, a pickled `torchvision.models.resnet.ResNet`, ...) is refused where the
//! pickle names it, and nothing in the file is ever called. Memo, stack, nesting, tensor views
//! and storages are bounded, and so is the archive (the entries its directory claims, each
//! entry's declared size, the storages read together: none more than the file holds), so a
//! corrupt file is an error, never a panic or a huge allocation (`tests/fuzz/` checks it).
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

mod archive;
mod error;
mod limits;
mod rebuild;
#[cfg(test)]
mod tests;
mod values;
mod vm;

use archive::Archive;
pub use error::PthError;
use limits::{MAX_OUTPUT_FACTOR, MAX_PICKLE_BYTES};
use vm::Vm;

/// One tensor of a state_dict: contiguous, little-endian.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// A state_dict as the file orders it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StateDict {
    pub tensors: Vec<Tensor>,
}

impl safetensors::View for &Tensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

impl StateDict {
    /// The state_dict as a safetensors file.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, String> {
        safetensors::serialize(self.tensors.iter().map(|t| (t.name.as_str(), t)), &None)
            .map_err(|e| format!("cannot write it as safetensors: {e:?}"))
    }
}

/// A zip archive (`torch.save`'s format since torch 1.6).
pub fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

/// A legacy torch file: pickle protocol 2, then torch's magic number as a LONG1.
pub fn is_legacy(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19")
}

/// Reads a `torch.save` file's state_dict.
pub fn read(path: &Path) -> Result<StateDict, PthError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| PthError::Io {
        path: shown.clone(),
        source,
    })?;
    read_bytes(&bytes, &shown)
}

/// Reads the state_dict of a `torch.save` file's bytes; `shown` names the file in errors.
pub fn read_bytes(bytes: &[u8], shown: &str) -> Result<StateDict, PthError> {
    let path = shown.to_string();
    if is_legacy(bytes) {
        return Err(PthError::Legacy { path });
    }
    let corrupt = |detail: String| PthError::Corrupt {
        path: shown.to_string(),
        detail,
    };
    if !is_zip(bytes) {
        return Err(corrupt("not a zip archive".into()));
    }
    let mut zip = Archive::open(bytes).map_err(corrupt)?;
    if let Some(order) = zip.entry("byteorder", 16).map_err(corrupt)? {
        if order != b"little" {
            return Err(corrupt(format!(
                "byte order '{}'; tchrun reads little-endian archives",
                String::from_utf8_lossy(&order)
            )));
        }
    }
    let file_len = bytes.len() as u64;
    let pickle = zip
        .entry("data.pkl", MAX_PICKLE_BYTES.min(file_len))
        .map_err(corrupt)?
        .ok_or_else(|| corrupt(format!("it lacks {}/data.pkl", zip.prefix)))?;
    let mut vm = Vm::new(&pickle);
    let root = vm.run().map_err(|f| f.into_error(shown))?;
    let entries = vm.state_dict(&root).map_err(|f| f.into_error(shown))?;

    let mut storages: HashMap<Rc<str>, Vec<u8>> = HashMap::new();
    let mut out = StateDict::default();
    let budget = bytes.len().saturating_mul(MAX_OUTPUT_FACTOR) + (1 << 20);
    let mut total = 0usize;
    // The storages' entries hold no more than the file (a valid archive's entries do not
    // overlap; entries that share their data could claim it many times over).
    let mut unread = file_len;
    for (name, t) in entries {
        let bad = |detail: String| PthError::BadTensor {
            path: shown.to_string(),
            tensor: name.clone(),
            detail,
        };
        if !storages.contains_key(&t.storage.key) {
            let entry = format!("data/{}", t.storage.key);
            let data = zip
                .entry(&entry, unread)
                .map_err(corrupt)?
                .ok_or_else(|| bad(format!("its storage {}/{entry} is missing", zip.prefix)))?;
            unread = unread.saturating_sub(data.len() as u64);
            storages.insert(t.storage.key.clone(), data);
        }
        let storage = storages
            .get(&t.storage.key)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let data = t.contiguous(storage).map_err(bad)?;
        total = total.saturating_add(data.len());
        if total > budget {
            return Err(PthError::Limit {
                path,
                what: format!(
                    "the tensors' total size ({total} bytes by '{name}', more than {MAX_OUTPUT_FACTOR} \
                     times the file's)"
                ),
            });
        }
        out.tensors.push(Tensor {
            name,
            dtype: t.dtype,
            shape: t.size.clone(),
            data,
        });
    }
    Ok(out)
}
