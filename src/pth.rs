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
//! and storages are bounded, so a corrupt file is an error, never a panic or a huge allocation.
use safetensors::Dtype;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::rc::Rc;

/// Largest `data.pkl` read (a state_dict's index of tensors, not their data: a few hundred KiB
/// for the largest torchvision models).
const MAX_PICKLE_BYTES: u64 = 64 << 20;
/// Values a pickle may push in all (bounds stack, memo and containers together).
const MAX_VALUES: usize = 8 << 20;
/// Distinct memo entries.
const MAX_MEMO: usize = 1 << 20;
/// Open MARKs at once (torch.save nests three deep).
const MAX_MARKS: usize = 256;
/// Dimensions of one tensor.
const MAX_DIMS: usize = 64;
/// Converted tensors may hold at most this many times the file's size (views that share a
/// storage are copied once each; broadcast views are refused outright).
const MAX_OUTPUT_FACTOR: usize = 4;

const FIX: &str = "save the weights with torch.save(model.state_dict(), PATH)";

/// A `.pth` file that cannot be read as a state_dict; the message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PthError {
    #[error("{path}: cannot read it: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: a legacy torch file (the format before torch 1.6, not a zip archive); re-save it \
         with a current torch: torch.save(torch.load(F), F2), and give F2"
    )]
    Legacy { path: String },
    #[error(
        "{path}: not a complete torch.save archive ({detail}): it may be truncated or corrupt; \
         {FIX}"
    )]
    Corrupt { path: String, detail: String },
    #[error(
        "{path}: refused: its pickle calls {global}, which is not part of a state_dict (tchrun \
         reads only tensors, dicts, lists, strings and numbers, and runs nothing from the file); \
         {FIX}"
    )]
    Global { path: String, global: String },
    #[error(
        "{path}: holds a whole pickled model ({class}), not a state_dict; save model.state_dict() \
         instead: torch.save(model.state_dict(), PATH)"
    )]
    WholeModel { path: String, class: String },
    #[error("{path}: not a state_dict (a dict of name -> tensor): {detail}")]
    NotAStateDict { path: String, detail: String },
    #[error(
        "{path}: holds a tensor of type {dtype}, which tchrun cannot convert (it reads float, \
         integer and bool tensors); convert it first, e.g. \
         torch.save({{k: v.float() for k, v in sd.items()}}, PATH)"
    )]
    UnsupportedDtype { path: String, dtype: String },
    #[error("{path}: tensor '{tensor}': {detail}; the file is corrupt: {FIX}")]
    BadTensor {
        path: String,
        tensor: String,
        detail: String,
    },
    #[error("{path}: {what} is over tchrun's limit; the file is corrupt or not a state_dict")]
    Limit { path: String, what: String },
}

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
    let pickle = zip
        .entry("data.pkl", MAX_PICKLE_BYTES)
        .map_err(corrupt)?
        .ok_or_else(|| corrupt(format!("it lacks {}/data.pkl", zip.prefix)))?;
    let mut vm = Vm::new(&pickle);
    let root = vm.run().map_err(|f| f.into_error(shown))?;
    let entries = vm.state_dict(&root).map_err(|f| f.into_error(shown))?;

    let mut storages: HashMap<Rc<str>, Vec<u8>> = HashMap::new();
    let mut out = StateDict::default();
    let budget = bytes.len().saturating_mul(MAX_OUTPUT_FACTOR) + (1 << 20);
    let mut total = 0usize;
    for (name, t) in entries {
        let bad = |detail: String| PthError::BadTensor {
            path: shown.to_string(),
            tensor: name.clone(),
            detail,
        };
        if !storages.contains_key(&t.storage.key) {
            let entry = format!("data/{}", t.storage.key);
            let data = zip
                .entry(&entry, bytes.len() as u64)
                .map_err(corrupt)?
                .ok_or_else(|| bad(format!("its storage {}/{entry} is missing", zip.prefix)))?;
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

/// The zip archive, its entries read through `ARCHIVE/` (the directory of the first entry, as
/// torch reads it). Stored (uncompressed) entries only, as torch writes them: an entry's data
/// is in the file, so its size is bounded by the file's.
struct Archive<'a> {
    zip: zip::ZipArchive<std::io::Cursor<&'a [u8]>>,
    prefix: String,
}

/// The zip reader on untrusted bytes: a panic in it is a corrupt file, not a crash.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err("the zip reader failed on it".into()))
}

impl<'a> Archive<'a> {
    fn open(bytes: &'a [u8]) -> Result<Archive<'a>, String> {
        guarded(|| {
            let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
                .map_err(|e| format!("zip: {e}"))?;
            let first = zip
                .by_index_raw(0)
                .map_err(|e| format!("zip: {e}"))?
                .name()
                .to_string();
            let prefix = match first.split_once('/') {
                Some((p, _)) if !p.is_empty() => p.to_string(),
                _ => return Err(format!("unexpected first entry '{first}'")),
            };
            Ok(Archive { zip, prefix })
        })
    }

    /// `ARCHIVE/name`, at most `limit` bytes; `None` when the archive has no such entry.
    fn entry(&mut self, name: &str, limit: u64) -> Result<Option<Vec<u8>>, String> {
        let full = format!("{}/{name}", self.prefix);
        let zip = &mut self.zip;
        guarded(|| {
            let mut f = match zip.by_name(&full) {
                Ok(f) => f,
                Err(zip::result::ZipError::FileNotFound) => return Ok(None),
                Err(e) => return Err(format!("{full}: {e}")),
            };
            if f.compression() != zip::CompressionMethod::Stored {
                return Err(format!(
                    "{full} is compressed ({:?}); torch.save writes uncompressed archives",
                    f.compression()
                ));
            }
            let size = f.size();
            if size > limit {
                return Err(format!("{full} declares {size} bytes, more than {limit}"));
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut f)
                .take(size + 1)
                .read_to_end(&mut data)
                .map_err(|e| format!("{full}: {e}"))?;
            if data.len() as u64 != size {
                return Err(format!(
                    "{full} holds {} bytes, its header says {size}",
                    data.len()
                ));
            }
            Ok(Some(data))
        })
    }
}

// ------------------------------------------------------------------ the restricted unpickler

/// What the reader may meet: the only globals a state_dict's pickle names.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildTensor,
    RebuildParameter,
    RebuildParameterWithState,
    /// `torch.FloatStorage` ... (the element type), or `torch.storage.UntypedStorage` (bytes).
    StorageType(Dtype),
    /// `torch.float32` ... (a `_rebuild_tensor_v3` argument).
    DtypeValue(Dtype),
}

/// A storage from a persistent id: `ARCHIVE/data/<key>`, `numel` elements of `elem`.
#[derive(Debug)]
struct Storage {
    key: Rc<str>,
    elem: Dtype,
    numel: usize,
}

/// A tensor: a view (offset, sizes, strides in elements of `dtype`) of a storage.
#[derive(Debug)]
struct TensorRef {
    storage: Rc<Storage>,
    dtype: Dtype,
    offset: usize,
    size: Vec<usize>,
    stride: Vec<usize>,
}

/// A value on the stack or in the memo; containers live in `Vm::objs` (so values are cheap to
/// copy, sharing is exact, and nothing is dropped recursively).
#[derive(Debug, Clone)]
#[cfg_attr(not(test), allow(dead_code))] // booleans' and floats' values: only tests look
enum V {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Obj(usize),
    Global(Global),
    Storage(Rc<Storage>),
    Tensor(Rc<TensorRef>),
}

#[derive(Debug)]
enum Obj {
    Tuple(Vec<V>),
    List(Vec<V>),
    Dict {
        items: Vec<(V, V)>,
        by_str: HashMap<Rc<str>, usize>,
    },
}

/// Why the pickle is refused (the file's path is added by `into_error`).
#[derive(Debug, PartialEq)]
enum Fail {
    Corrupt(String),
    Global(String),
    WholeModel(String),
    NotAStateDict(String),
    UnsupportedDtype(String),
    Limit(String),
}

impl Fail {
    fn into_error(self, path: &str) -> PthError {
        let path = path.to_string();
        match self {
            Fail::Corrupt(detail) => PthError::Corrupt { path, detail },
            Fail::Global(global) => PthError::Global { path, global },
            Fail::WholeModel(class) => PthError::WholeModel { path, class },
            Fail::NotAStateDict(detail) => PthError::NotAStateDict { path, detail },
            Fail::UnsupportedDtype(dtype) => PthError::UnsupportedDtype { path, dtype },
            Fail::Limit(what) => PthError::Limit { path, what },
        }
    }
}

fn elem_size(d: Dtype) -> usize {
    match d {
        Dtype::BOOL | Dtype::U8 | Dtype::I8 => 1,
        Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
        Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
        _ => 8,
    }
}

/// `module.name` as the reader knows it; every other global is refused here, before anything
/// could use it.
fn resolve_global(module: &str, name: &str) -> Result<Global, Fail> {
    let storage = |n: &str| {
        Some(match n {
            "DoubleStorage" => Dtype::F64,
            "FloatStorage" => Dtype::F32,
            "HalfStorage" => Dtype::F16,
            "BFloat16Storage" => Dtype::BF16,
            "LongStorage" => Dtype::I64,
            "IntStorage" => Dtype::I32,
            "ShortStorage" => Dtype::I16,
            "CharStorage" => Dtype::I8,
            "ByteStorage" => Dtype::U8,
            "BoolStorage" => Dtype::BOOL,
            _ => return None,
        })
    };
    let dtype = |n: &str| {
        Some(match n {
            "float64" | "double" => Dtype::F64,
            "float32" | "float" => Dtype::F32,
            "float16" | "half" => Dtype::F16,
            "bfloat16" => Dtype::BF16,
            "int64" | "long" => Dtype::I64,
            "int32" | "int" => Dtype::I32,
            "int16" | "short" => Dtype::I16,
            "int8" => Dtype::I8,
            "uint8" => Dtype::U8,
            "uint16" => Dtype::U16,
            "uint32" => Dtype::U32,
            "uint64" => Dtype::U64,
            "bool" => Dtype::BOOL,
            _ => return None,
        })
    };
    let other_tensor_type = |n: &str| {
        let simple = !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        simple
            && (n.ends_with("Storage")
                || [
                    "float8_", "complex", "qint", "quint", "bits", "uint1", "int1", "float4",
                ]
                .iter()
                .any(|p| n.starts_with(p)))
    };
    if module == "torch" {
        if let Some(d) = storage(name) {
            return Ok(Global::StorageType(d));
        }
        if let Some(d) = dtype(name) {
            return Ok(Global::DtypeValue(d));
        }
        if other_tensor_type(name) {
            return Err(Fail::UnsupportedDtype(format!("torch.{name}")));
        }
    }
    Ok(match (module, name) {
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_tensor_v3") => Global::RebuildTensorV3,
        ("torch._utils", "_rebuild_tensor") => Global::RebuildTensor,
        ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Global::RebuildParameterWithState,
        ("torch.storage", "UntypedStorage") => Global::StorageType(Dtype::U8),
        _ => {
            let class = name.chars().next().is_some_and(|c| c.is_ascii_uppercase());
            let model_module = module == "__main__"
                || ["torchvision.", "torch.nn.", "timm.", "__torch__"]
                    .iter()
                    .any(|p| module.starts_with(p));
            return Err(if class && model_module {
                Fail::WholeModel(format!("{module}.{name}"))
            } else {
                Fail::Global(format!("{module}.{name}"))
            });
        }
    })
}

/// Pickle opcode names, for the error that refuses one.
fn opcode_name(op: u8) -> &'static str {
    match op {
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'L' => "LONG",
        0x8b => "LONG4",
        b'P' => "PERSID",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8e => "BINBYTES8",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        b'd' => "DICT",
        b'l' => "LIST",
        b'i' => "INST",
        b'o' => "OBJ",
        b'g' => "GET",
        b'p' => "PUT",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        _ => "unknown",
    }
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<V>,
    marks: Vec<usize>,
    memo: HashMap<u32, V>,
    objs: Vec<Obj>,
    pushed: usize,
}

impl<'a> Vm<'a> {
    fn new(data: &'a [u8]) -> Vm<'a> {
        Vm {
            data,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            objs: Vec::new(),
            pushed: 0,
        }
    }

    fn corrupt<T>(&self, what: impl std::fmt::Display) -> Result<T, Fail> {
        Err(Fail::Corrupt(format!("data.pkl byte {}: {what}", self.pos)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Fail> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.data.len() => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.corrupt("the pickle ends early"),
        }
    }

    fn u8(&mut self) -> Result<u8, Fail> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Result<[u8; N], Fail> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn line(&mut self) -> Result<&'a str, Fail> {
        let rest = &self.data[self.pos..];
        let Some(n) = rest.iter().take(1024).position(|&b| b == b'\n') else {
            return self.corrupt("a GLOBAL name without its end");
        };
        let s = std::str::from_utf8(&rest[..n]).or_else(|_| self.corrupt("a non-UTF-8 name"))?;
        self.pos += n + 1;
        Ok(s)
    }

    fn string(&mut self, n: usize) -> Result<V, Fail> {
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(V::Str(Rc::from(s))),
            Err(_) => self.corrupt("a string that is not UTF-8"),
        }
    }

    fn push(&mut self, v: V) -> Result<(), Fail> {
        self.pushed += 1;
        if self.pushed > MAX_VALUES {
            return Err(Fail::Limit(format!(
                "the pickle's number of values (more than {MAX_VALUES})"
            )));
        }
        self.stack.push(v);
        Ok(())
    }

    fn new_obj(&mut self, o: Obj) -> Result<(), Fail> {
        self.objs.push(o);
        self.push(V::Obj(self.objs.len() - 1))
    }

    fn new_dict(&mut self) -> Result<(), Fail> {
        self.new_obj(Obj::Dict {
            items: Vec::new(),
            by_str: HashMap::new(),
        })
    }

    fn pop(&mut self) -> Result<V, Fail> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.corrupt("a value is popped from an empty stack");
        }
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.corrupt("a value is popped from an empty stack"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<V>, Fail> {
        let Some(m) = self.marks.pop() else {
            return self.corrupt("no MARK to close");
        };
        if m > self.stack.len() {
            return self.corrupt("a MARK below the stack");
        }
        Ok(self.stack.split_off(m))
    }

    fn memo_put(&mut self, idx: u32) -> Result<(), Fail> {
        let Some(top) = self.stack.last().cloned() else {
            return self.corrupt("PUT on an empty stack");
        };
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&idx) {
            return Err(Fail::Limit(format!(
                "the pickle's memo (more than {MAX_MEMO} entries)"
            )));
        }
        self.memo.insert(idx, top);
        Ok(())
    }

    fn memo_get(&mut self, idx: u32) -> Result<(), Fail> {
        match self.memo.get(&idx).cloned() {
            Some(v) => self.push(v),
            None => self.corrupt(format!("GET of memo entry {idx}, which was never PUT")),
        }
    }

    fn tuple(&self, v: &V) -> Option<&'_ [V]> {
        match v {
            V::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Tuple(t)) => Some(t),
                _ => None,
            },
            _ => None,
        }
    }

    fn describe(&self, v: &V) -> &'static str {
        match v {
            V::None => "None",
            V::Bool(_) => "a bool",
            V::Int(_) => "an int",
            V::Float(_) => "a float",
            V::Str(_) => "a string",
            V::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Tuple(_)) => "a tuple",
                Some(Obj::List(_)) => "a list",
                _ => "a dict",
            },
            V::Global(_) => "a type",
            V::Storage(_) => "a storage",
            V::Tensor(_) => "a tensor",
        }
    }

    /// Top of the stack as a dict (SETITEM(S), BUILD).
    fn top_dict(&mut self) -> Result<&mut Obj, Fail> {
        let id = match self.stack.last() {
            Some(V::Obj(i)) => *i,
            _ => return self.corrupt("SETITEM on something that is not a dict"),
        };
        match self.objs.get_mut(id) {
            Some(d @ Obj::Dict { .. }) => Ok(d),
            _ => Err(Fail::Corrupt(
                "data.pkl: SETITEM on something that is not a dict".into(),
            )),
        }
    }

    fn set_items(&mut self, kv: Vec<V>) -> Result<(), Fail> {
        if kv.len() & 1 != 0 {
            return self.corrupt("SETITEMS with a key and no value");
        }
        let Obj::Dict { items, by_str } = self.top_dict()? else {
            return Err(Fail::Corrupt("data.pkl: SETITEM on a non-dict".into()));
        };
        let mut it = kv.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let V::Str(s) = &k {
                if let Some(&at) = by_str.get(s) {
                    items[at].1 = v;
                    continue;
                }
                by_str.insert(s.clone(), items.len());
            }
            items.push((k, v));
        }
        Ok(())
    }

    fn append(&mut self, vs: Vec<V>) -> Result<(), Fail> {
        let id = match self.stack.last() {
            Some(V::Obj(i)) => *i,
            _ => return self.corrupt("APPEND to something that is not a list"),
        };
        match self.objs.get_mut(id) {
            Some(Obj::List(l)) => {
                l.extend(vs);
                Ok(())
            }
            _ => self.corrupt("APPEND to something that is not a list"),
        }
    }

    /// Runs the pickle to its STOP; the object it built.
    fn run(&mut self) -> Result<V, Fail> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return self.corrupt(format!("pickle protocol {proto}"));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: a length hint
                }
                b'}' => self.new_dict()?,
                b']' => self.new_obj(Obj::List(Vec::new()))?,
                b')' => self.new_obj(Obj::Tuple(Vec::new()))?,
                b'(' => {
                    if self.marks.len() >= MAX_MARKS {
                        return Err(Fail::Limit(format!(
                            "the pickle's nesting (more than {MAX_MARKS} MARKs)"
                        )));
                    }
                    self.marks.push(self.stack.len());
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.le()?) as usize;
                    let s = self.string(n)?;
                    self.push(s)?;
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let s = self.string(n)?;
                    self.push(s)?;
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.le()?);
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    let s = self.string(n)?;
                    self.push(s)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let g = resolve_global(module, name)?;
                    self.push(V::Global(g))?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (V::Str(module), V::Str(name)) = (module, name) else {
                        return self.corrupt("STACK_GLOBAL of values that are not strings");
                    };
                    let g = resolve_global(&module, &name)?;
                    self.push(V::Global(g))?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let s = self.persistent_load(&pid)?;
                    self.push(V::Storage(Rc::new(s)))?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.new_obj(Obj::Tuple(items))?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return self.corrupt("TUPLE of missing values");
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.new_obj(Obj::Tuple(items))?;
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(&callable, &args)?;
                    self.push(v)?;
                }
                b'b' => {
                    let state = self.pop()?;
                    self.build(&state)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let kv = self.pop_mark()?;
                    self.set_items(kv)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let vs = self.pop_mark()?;
                    self.append(vs)?;
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(V::Int(v as i64))?;
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(V::Int(v as i64))?;
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(V::Int(v as i64))?;
                }
                0x8a => {
                    let n = self.u8()? as usize;
                    if n > 8 {
                        return self.corrupt(format!("an integer of {n} bytes"));
                    }
                    let b = self.take(n)?;
                    let mut a = if b.last().is_some_and(|&x| x & 0x80 != 0) {
                        [0xffu8; 8]
                    } else {
                        [0u8; 8]
                    };
                    a[..n].copy_from_slice(b);
                    self.push(V::Int(i64::from_le_bytes(a)))?;
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.push(V::Float(v))?;
                }
                0x88 => self.push(V::Bool(true))?,
                0x89 => self.push(V::Bool(false))?,
                b'N' => self.push(V::None)?,
                b'q' => {
                    let i = self.u8()? as u32;
                    self.memo_put(i)?;
                }
                b'r' => {
                    let i = u32::from_le_bytes(self.le()?);
                    self.memo_put(i)?;
                }
                0x94 => {
                    let i = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                    self.memo_put(i)?;
                }
                b'h' => {
                    let i = self.u8()? as u32;
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = u32::from_le_bytes(self.le()?);
                    self.memo_get(i)?;
                }
                b'.' => {
                    return match self.stack.pop() {
                        Some(v) => Ok(v),
                        None => self.corrupt("STOP with an empty stack"),
                    };
                }
                _ => {
                    self.pos = at;
                    return self.corrupt(format!(
                        "pickle opcode 0x{op:02x} ({}), which a state_dict saved by torch.save \
                         does not use",
                        opcode_name(op)
                    ));
                }
            }
        }
    }

    /// `('storage', torch.FloatStorage, key, location, numel)`.
    fn persistent_load(&self, pid: &V) -> Result<Storage, Fail> {
        const BAD: &str = "a persistent id that is not ('storage', type, key, location, numel)";
        let Some(t) = self.tuple(pid) else {
            return self.corrupt(BAD);
        };
        let [V::Str(kind), V::Global(Global::StorageType(elem)), key, _location, V::Int(numel)] = t
        else {
            return self.corrupt(BAD);
        };
        if &**kind != "storage" {
            return self.corrupt(BAD);
        }
        let key: Rc<str> = match key {
            V::Str(s) => s.clone(),
            V::Int(i) => Rc::from(i.to_string()),
            _ => return self.corrupt(BAD),
        };
        let numel = usize::try_from(*numel).or_else(|_| self.corrupt(BAD))?;
        match numel.checked_mul(elem_size(*elem)) {
            Some(b) if b <= isize::MAX as usize => {}
            _ => return self.corrupt(format!("a storage of {numel} elements")),
        }
        Ok(Storage {
            key,
            elem: *elem,
            numel,
        })
    }

    fn dims(&self, v: &V, what: &str) -> Result<Vec<usize>, Fail> {
        let Some(t) = self.tuple(v) else {
            return self.corrupt(format!("a tensor {what} that is not a tuple"));
        };
        if t.len() > MAX_DIMS {
            return self.corrupt(format!("a tensor of {} dimensions", t.len()));
        }
        t.iter()
            .map(|d| match d {
                V::Int(i) if *i >= 0 => Ok(*i as usize),
                _ => self.corrupt(format!(
                    "a tensor {what} that holds a negative or non-integer"
                )),
            })
            .collect()
    }

    /// The only calls a state_dict's pickle makes; each builds a value, none runs anything.
    fn reduce(&mut self, callable: &V, args: &V) -> Result<V, Fail> {
        // Every call this reader knows takes at most 8 arguments: only those are copied.
        let args: Vec<V> = match self.tuple(args) {
            Some(t) if t.len() <= 8 => t.to_vec(),
            Some(t) => return self.corrupt(format!("REDUCE with {} arguments", t.len())),
            None => return self.corrupt("REDUCE with arguments that are not a tuple"),
        };
        let g = match callable {
            V::Global(g) => *g,
            other => {
                return self.corrupt(format!(
                    "REDUCE of {}, which is not callable",
                    self.describe(other)
                ))
            }
        };
        let tensor =
            |vm: &Self, storage: &V, offset: &V, size: &V, stride: &V, dtype: Option<&V>| {
                let V::Storage(s) = storage else {
                    return vm.corrupt("a tensor without a storage");
                };
                let V::Int(offset) = offset else {
                    return vm.corrupt("a tensor offset that is not an integer");
                };
                let offset =
                    usize::try_from(*offset).or_else(|_| vm.corrupt("a negative offset"))?;
                let size = vm.dims(size, "size")?;
                let stride = vm.dims(stride, "stride")?;
                if size.len() != stride.len() {
                    return vm.corrupt("a tensor with as many sizes as strides");
                }
                let dtype = match dtype {
                    None => s.elem,
                    Some(V::Global(Global::DtypeValue(d))) => *d,
                    Some(_) => return vm.corrupt("a tensor dtype that is not a torch dtype"),
                };
                Ok(V::Tensor(Rc::new(TensorRef {
                    storage: s.clone(),
                    dtype,
                    offset,
                    size,
                    stride,
                })))
            };
        match (g, args.as_slice()) {
            (Global::OrderedDict, []) => {
                self.objs.push(Obj::Dict {
                    items: Vec::new(),
                    by_str: HashMap::new(),
                });
                Ok(V::Obj(self.objs.len() - 1))
            }
            (Global::RebuildTensorV2, [s, o, size, stride, _, _])
            | (Global::RebuildTensorV2, [s, o, size, stride, _, _, _])
            | (Global::RebuildTensor, [s, o, size, stride]) => {
                tensor(self, s, o, size, stride, None)
            }
            (Global::RebuildTensorV3, [s, o, size, stride, _, _, d])
            | (Global::RebuildTensorV3, [s, o, size, stride, _, _, d, _]) => {
                tensor(self, s, o, size, stride, Some(d))
            }
            (Global::RebuildParameter, [t @ V::Tensor(_), _, _])
            | (Global::RebuildParameterWithState, [t @ V::Tensor(_), _, _, _]) => Ok(t.clone()),
            (Global::StorageType(_) | Global::DtypeValue(_), _) => {
                self.corrupt("REDUCE of a tensor type, which is not callable")
            }
            (g, args) => self.corrupt(format!(
                "REDUCE of {g:?} with {} arguments it does not take",
                args.len()
            )),
        }
    }

    /// BUILD: a dict's state (the `_metadata` that `state_dict()` sets) is accepted and
    /// ignored; nothing else is built.
    fn build(&mut self, state: &V) -> Result<(), Fail> {
        let target_is_dict = matches!(
            self.stack.last(),
            Some(V::Obj(i)) if matches!(self.objs.get(*i), Some(Obj::Dict { .. }))
        );
        let state_ok = match state {
            V::None => true,
            V::Obj(i) => matches!(self.objs.get(*i), Some(Obj::Dict { .. } | Obj::Tuple(_))),
            _ => false,
        };
        if target_is_dict && state_ok {
            Ok(())
        } else {
            self.corrupt("BUILD of something other than a dict's attributes")
        }
    }

    fn dict_items(&self, v: &V) -> Option<&[(V, V)]> {
        match v {
            V::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Dict { items, .. }) => Some(items),
                _ => None,
            },
            _ => None,
        }
    }

    /// The pickled object as a state_dict: a dict of name -> tensor, in order. A checkpoint
    /// dict holding a state_dict is named as such, with the entry to save.
    fn state_dict(&self, root: &V) -> Result<Vec<(String, Rc<TensorRef>)>, Fail> {
        let Some(items) = self.dict_items(root) else {
            return Err(Fail::NotAStateDict(format!(
                "it holds {}; {FIX}",
                self.describe(root)
            )));
        };
        if items.is_empty() {
            return Err(Fail::NotAStateDict(format!(
                "it holds an empty dict; {FIX}"
            )));
        }
        let mut out = Vec::with_capacity(items.len());
        for (k, v) in items {
            let V::Str(name) = k else {
                return Err(Fail::NotAStateDict(format!(
                    "it holds a dict with {} key; {FIX}",
                    self.describe(k)
                )));
            };
            match v {
                V::Tensor(t) => out.push((name.to_string(), t.clone())),
                other => {
                    let nested = items.iter().find_map(|(k, v)| {
                        let inner = self.dict_items(v)?;
                        let all_tensors = !inner.is_empty()
                            && inner
                                .iter()
                                .all(|(k, v)| matches!((k, v), (V::Str(_), V::Tensor(_))));
                        match (k, all_tensors) {
                            (V::Str(k), true) => Some((k.clone(), inner.len())),
                            _ => None,
                        }
                    });
                    return Err(Fail::NotAStateDict(match nested {
                        Some((key, n)) => format!(
                            "it holds a checkpoint (entry '{name}' is {}) whose entry '{key}' is \
                             a dict of {n} tensors: save that entry alone, \
                             torch.save(checkpoint['{key}'], PATH), and give that file",
                            self.describe(other)
                        ),
                        None => format!(
                            "entry '{name}' is {}, not a tensor; {FIX}",
                            self.describe(other)
                        ),
                    }));
                }
            }
        }
        Ok(out)
    }
}

impl TensorRef {
    /// The view as a contiguous little-endian copy, checked against its storage (`storage`:
    /// the archive entry's bytes).
    fn contiguous(&self, storage: &[u8]) -> Result<Vec<u8>, String> {
        let es = elem_size(self.dtype);
        let storage_bytes = self.storage.numel * elem_size(self.storage.elem);
        if storage.len() < storage_bytes {
            return Err(format!(
                "its storage data/{} holds {} bytes, {storage_bytes} expected",
                self.storage.key,
                storage.len()
            ));
        }
        let view = || {
            format!(
                "its view (offset {}, size {:?}, stride {:?})",
                self.offset, self.size, self.stride
            )
        };
        let numel = self
            .size
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("{} has too many elements", view()))?;
        if numel == 0 {
            return Ok(Vec::new());
        }
        // The last element the view reaches; within the storage, with no more elements than
        // the storage holds (broadcast views are refused: they would multiply the data).
        let last = self
            .size
            .iter()
            .zip(&self.stride)
            .try_fold(self.offset, |a, (&n, &s)| {
                a.checked_add((n - 1).checked_mul(s)?)
            });
        let fits = |elems: usize| elems.checked_mul(es).is_some_and(|b| b <= storage_bytes);
        match last {
            Some(last) if last.checked_add(1).is_some_and(fits) && fits(numel) => {}
            _ => {
                return Err(format!(
                    "{} needs more than its storage's {storage_bytes} bytes",
                    view()
                ))
            }
        }
        let mut out = Vec::with_capacity(numel * es);
        let nd = self.size.len();
        if nd == 0 {
            out.extend_from_slice(&storage[self.offset * es..(self.offset + 1) * es]);
            return Ok(out);
        }
        // Row by row over the last dimension, an odometer over the others.
        let (inner, inner_stride) = (self.size[nd - 1], self.stride[nd - 1]);
        let mut idx = vec![0usize; nd - 1];
        for _ in 0..numel / inner {
            let base = self.offset
                + idx
                    .iter()
                    .zip(&self.stride)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            if inner_stride == 1 {
                out.extend_from_slice(&storage[base * es..(base + inner) * es]);
            } else {
                for j in 0..inner {
                    let e = base + j * inner_stride;
                    out.extend_from_slice(&storage[e * es..(e + 1) * es]);
                }
            }
            for d in (0..nd - 1).rev() {
                idx[d] += 1;
                if idx[d] < self.size[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unpickle(p: &[u8]) -> Result<(Vm<'_>, V), Fail> {
        let mut vm = Vm::new(p);
        let v = vm.run()?;
        Ok((vm, v))
    }

    fn err(p: &[u8]) -> Fail {
        match unpickle(p) {
            Ok((_, v)) => panic!("accepted: {v:?}"),
            Err(f) => f,
        }
    }

    /// A pickle: PROTO 2, `body`, STOP.
    fn pk(body: &[u8]) -> Vec<u8> {
        let mut v = vec![0x80, 2];
        v.extend_from_slice(body);
        v.push(b'.');
        v
    }

    fn ustr(s: &str) -> Vec<u8> {
        let mut v = vec![b'X'];
        v.extend_from_slice(&(s.len() as u32).to_le_bytes());
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn global(m: &str, n: &str) -> Vec<u8> {
        format!("c{m}\n{n}\n").into_bytes()
    }

    /// `_rebuild_tensor_v2(storage(key, dtype, numel), offset, size, stride, False, OrderedDict())`.
    fn tensor_pickle(
        key: &str,
        storage: &str,
        numel: u8,
        off: u8,
        size: &[u8],
        stride: &[u8],
    ) -> Vec<u8> {
        let mut b = global("torch._utils", "_rebuild_tensor_v2");
        b.push(b'(');
        b.push(b'(');
        b.extend(ustr("storage"));
        b.extend(global("torch", storage));
        b.extend(ustr(key));
        b.extend(ustr("cpu"));
        b.extend([b'K', numel, b't', b'Q', b'K', off]);
        for dims in [size, stride] {
            b.push(b'(');
            for &d in dims {
                b.extend([b'K', d]);
            }
            b.push(b't');
        }
        b.push(0x89);
        b.extend(global("collections", "OrderedDict"));
        b.extend([b')', b'R', b't', b'R']);
        b
    }

    #[test]
    fn reads_scalars_containers_and_memo() {
        // {'a': [1, -2, 300, 70000, 2**40, 1.5, True, None], 'b': memo copy of the list}
        let mut b = vec![b'}', b'q', 0, b'('];
        b.extend(ustr("a"));
        b.extend([b']', b'q', 1, b'(', b'K', 1, b'J']);
        b.extend((-2i32).to_le_bytes());
        b.extend([b'M', 0x2c, 0x01, b'J']);
        b.extend(70000i32.to_le_bytes());
        b.extend([0x8a, 6, 0, 0, 0, 0, 0, 1, b'G']);
        b.extend(1.5f64.to_be_bytes());
        b.extend([0x88, b'N', b'e']);
        b.extend(ustr("b"));
        b.extend([b'h', 1, b'u']);
        let p = pk(&b);
        let (vm, root) = unpickle(&p).expect("reads");
        let items = vm.dict_items(&root).expect("dict");
        assert_eq!(items.len(), 2);
        let (V::Obj(a), V::Obj(b)) = (&items[0].1, &items[1].1) else {
            panic!("{items:?}")
        };
        assert_eq!(a, b, "the memo shares the list");
        let Obj::List(l) = &vm.objs[*a] else { panic!() };
        let ints: Vec<i64> = l
            .iter()
            .filter_map(|v| if let V::Int(i) = v { Some(*i) } else { None })
            .collect();
        assert_eq!(ints, vec![1, -2, 300, 70000, 1 << 40]);
        assert!(matches!(l[5], V::Float(f) if f == 1.5));
        assert!(matches!(l[6], V::Bool(true)));
        assert!(matches!(l[7], V::None));
    }

    #[test]
    fn long1_is_signed() {
        let (_, v) = unpickle(&pk(&[0x8a, 1, 0xff])).expect("reads");
        assert!(matches!(v, V::Int(-1)));
        let (_, v) = unpickle(&pk(&[0x8a, 0])).expect("reads");
        assert!(matches!(v, V::Int(0)));
        assert!(matches!(
            err(&pk(&[0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
            Fail::Corrupt(_)
        ));
    }

    #[test]
    fn refuses_unknown_globals_before_anything_else() {
        for (m, n) in [
            ("posix", "system"),
            ("os", "system"),
            ("builtins", "eval"),
            ("__builtin__", "getattr"),
            ("torch", "load"),
            ("subprocess", "Popen"),
        ] {
            let mut b = global(m, n);
            b.extend(ustr("touch /tmp/x"));
            b.extend([0x85, b'R']);
            assert_eq!(err(&pk(&b)), Fail::Global(format!("{m}.{n}")));
        }
        assert_eq!(
            err(&pk(&global("torchvision.models.resnet", "ResNet"))),
            Fail::WholeModel("torchvision.models.resnet.ResNet".into())
        );
        assert_eq!(
            err(&pk(&global("__main__", "Net"))),
            Fail::WholeModel("__main__.Net".into())
        );
        // Protocol 4's STACK_GLOBAL goes through the same gate.
        let mut b = vec![0x8c, 5];
        b.extend(b"posix");
        b.extend([0x8c, 6]);
        b.extend(b"system");
        b.push(0x93);
        assert_eq!(err(&pk(&b)), Fail::Global("posix.system".into()));
        assert_eq!(
            err(&pk(&global("torch", "ComplexFloatStorage"))),
            Fail::UnsupportedDtype("torch.ComplexFloatStorage".into())
        );
    }

    #[test]
    fn reduce_of_anything_but_the_known_rebuilds_is_an_error() {
        // A storage type is a value, not a callable.
        let mut b = global("torch", "FloatStorage");
        b.push(b')');
        b.push(b'R');
        assert!(matches!(err(&pk(&b)), Fail::Corrupt(m) if m.contains("not callable")));
        // A string is not callable either.
        let mut b = ustr("posix.system");
        b.extend([b')', b'R']);
        assert!(matches!(err(&pk(&b)), Fail::Corrupt(m) if m.contains("not callable")));
        // OrderedDict takes no arguments here.
        let mut b = global("collections", "OrderedDict");
        b.extend([b'K', 1, 0x85, b'R']);
        assert!(matches!(err(&pk(&b)), Fail::Corrupt(_)));
        // BUILD on something that is not a dict.
        assert!(matches!(err(&pk(b"]}b")), Fail::Corrupt(_)));
    }

    #[test]
    fn unknown_opcodes_are_named() {
        for (op, name) in [
            (b'i', "INST"),
            (b'o', "OBJ"),
            (b'I', "INT"),
            (0x92, "NEWOBJ_EX"),
            (0xff, "unknown"),
        ] {
            match err(&pk(&[op])) {
                Fail::Corrupt(m) => assert!(m.contains(name) && m.contains("byte 2"), "{m}"),
                f => panic!("{f:?}"),
            }
        }
    }

    #[test]
    fn corrupt_pickles_are_errors_not_panics() {
        for p in [
            &b""[..],
            b"\x80\x02",
            b"\x80\x02.",
            b"\x80\x02t.",
            b"\x80\x02(K\x01\x86.",
            b"\x80\x02h\x05.",
            b"\x80\x02X\xff\xff\xff\xff",
            b"\x80\x02s.",
            b"\x80\x02K\x01K\x02s.",
            b"\x80\x02]K\x01s.",
            b"\x80\x02}(K\x01u.",
            b"\x80\x02(K\x01e.",
            b"\x80\x02ctorch\nFloatStorage",
            b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\x80\x02)Q.",
            b"\x80\x09.",
            b"\x80\x02(K\x01(K\x02\x86.",
        ] {
            assert!(matches!(err(p), Fail::Corrupt(_)), "{p:?}");
        }
    }

    #[test]
    fn memo_and_nesting_are_bounded() {
        // LONG_BINPUT far apart: a hash map, not a vector of 4 G entries; more than
        // MAX_MEMO distinct entries is refused.
        let mut b = vec![b'N'];
        for i in 0..=MAX_MEMO as u32 {
            b.push(b'r');
            b.extend((i.wrapping_mul(4099)).to_le_bytes());
        }
        assert!(matches!(err(&pk(&b)), Fail::Limit(m) if m.contains("memo")));
        let mut b = vec![b'N', b'r'];
        b.extend(u32::MAX.to_le_bytes());
        b.push(b'j');
        b.extend(u32::MAX.to_le_bytes());
        assert!(unpickle(&pk(&b)).is_ok());
        // MARKs nested without end.
        let b = vec![b'('; MAX_MARKS + 1];
        assert!(matches!(err(&pk(&b)), Fail::Limit(m) if m.contains("MARK")));
        // Deeply nested tuples are flat in the arena: no recursion anywhere.
        let mut b = vec![b'N'];
        b.extend(vec![0x85u8; 200_000]);
        assert!(unpickle(&pk(&b)).is_ok());
    }

    #[test]
    fn values_are_bounded() {
        // A memoized list pushed again and again costs one value each, until the limit.
        let mut b = vec![b']', b'q', 0, b'(', b'h', 0];
        b.extend([b'h', 0].repeat(MAX_VALUES));
        assert!(matches!(err(&pk(&b)), Fail::Limit(m) if m.contains("values")));
    }

    #[test]
    fn tensors_views_and_their_bounds() {
        // {'w': tensor of storage '0' (6 floats), offset 1, size (2, 2), stride (1, 3)}
        let mut b = vec![b'}', b'('];
        b.extend(ustr("w"));
        b.extend(tensor_pickle("0", "FloatStorage", 6, 1, &[2, 2], &[1, 3]));
        b.extend(ustr("n"));
        b.extend(tensor_pickle("1", "LongStorage", 1, 0, &[], &[]));
        b.push(b'u');
        // state_dict()'s _metadata: BUILD with a dict state, ignored.
        b.extend([b'}', b'b']);
        let p = pk(&b);
        let (vm, root) = unpickle(&p).expect("reads");
        let sd = vm.state_dict(&root).expect("a state_dict");
        assert_eq!(sd.len(), 2);
        let (name, w) = &sd[0];
        assert_eq!(name, "w");
        assert_eq!((w.dtype, w.offset), (Dtype::F32, 1));
        let storage: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let got = w.contiguous(&storage).expect("fits");
        let vals: Vec<f32> = got
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // element [i][j] = storage[1 + i + 3 j]
        assert_eq!(vals, vec![1.0, 4.0, 2.0, 5.0]);
        assert!(
            w.contiguous(&storage[..20]).is_err(),
            "a short storage entry"
        );
        let (_, n) = &sd[1];
        assert_eq!(
            n.contiguous(&7i64.to_le_bytes()).expect("scalar"),
            7i64.to_le_bytes()
        );

        // Views that run past their storage, or broadcast it, are refused.
        for (numel, off, size, stride) in [
            (6u8, 0u8, &[2u8, 3][..], &[3u8, 1][..]),
            (6, 1, &[2, 3], &[3, 1]),
            (6, 0, &[7], &[1]),
            (6, 0, &[4, 4], &[0, 1]),
            (
                6,
                0,
                &[255, 255, 255, 255, 255, 255, 255, 255, 255],
                &[0; 9],
            ),
        ] {
            let mut b = vec![b'}', b'('];
            b.extend(ustr("t"));
            b.extend(tensor_pickle("0", "FloatStorage", numel, off, size, stride));
            b.push(b'u');
            let p = pk(&b);
            let (vm, root) = unpickle(&p).expect("reads");
            let sd = vm.state_dict(&root).expect("a state_dict");
            let r = sd[0].1.contiguous(&storage);
            assert_eq!(
                r.is_ok(),
                off == 0 && size == [2, 3],
                "{size:?} {stride:?}: {r:?}"
            );
        }
    }

    #[test]
    fn not_a_state_dict() {
        let p = pk(b"]");
        let (vm, root) = unpickle(&p).expect("reads");
        assert!(matches!(vm.state_dict(&root), Err(Fail::NotAStateDict(m)) if m.contains("list")));
        let p = pk(b"}");
        let (vm, root) = unpickle(&p).expect("reads");
        assert!(matches!(vm.state_dict(&root), Err(Fail::NotAStateDict(m)) if m.contains("empty")));
        // A checkpoint: {'epoch': 3, 'model': {'w': tensor}}
        let mut b = vec![b'}', b'('];
        b.extend(ustr("epoch"));
        b.extend([b'K', 3]);
        b.extend(ustr("model"));
        b.extend([b'}', b'(']);
        b.extend(ustr("w"));
        b.extend(tensor_pickle("0", "FloatStorage", 1, 0, &[1], &[1]));
        b.extend([b'u', b'u']);
        let p = pk(&b);
        let (vm, root) = unpickle(&p).expect("reads");
        match vm.state_dict(&root) {
            Err(Fail::NotAStateDict(m)) => assert!(
                m.contains("entry 'model' is a dict of 1 tensors")
                    && m.contains("torch.save(checkpoint['model'], PATH)"),
                "{m}"
            ),
            r => panic!("{r:?}"),
        }
    }

    /// A stored zip archive as torch.save lays it out.
    fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts =
            zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
        for (name, data) in entries {
            w.start_file(*name, opts).expect("entry");
            std::io::Write::write_all(&mut w, data).expect("write");
        }
        w.finish().expect("zip").into_inner()
    }

    #[test]
    fn reads_an_archive_and_converts_to_safetensors() {
        let mut b = vec![b'}', b'('];
        b.extend(ustr("t"));
        b.extend(tensor_pickle("0", "FloatStorage", 6, 0, &[3, 2], &[1, 3]));
        b.extend(ustr("u"));
        b.extend(tensor_pickle("0", "FloatStorage", 6, 0, &[2, 3], &[3, 1]));
        b.push(b'u');
        let p = pk(&b);
        let storage: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let zip = archive(&[
            ("a/data.pkl", &p),
            ("a/byteorder", b"little"),
            ("a/data/0", &storage),
            ("a/version", b"3\n"),
        ]);
        let sd = read_bytes(&zip, "x.pth").expect("reads");
        let bytes = sd.to_safetensors().expect("safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
        let t = st.tensor("t").expect("t");
        assert_eq!(t.shape(), &[3, 2]);
        let vals: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(
            vals,
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
            "the transpose, contiguous"
        );
        assert_eq!(st.tensor("u").expect("u").data(), &storage[..]);

        // A missing storage, a short one, a big-endian archive, a truncated file.
        let zip = archive(&[("a/data.pkl", &p)]);
        let e = read_bytes(&zip, "x.pth").expect_err("no storage");
        assert!(e.to_string().contains("a/data/0 is missing"), "{e}");
        let zip = archive(&[("a/data.pkl", &p), ("a/data/0", &storage[..8])]);
        let e = read_bytes(&zip, "x.pth").expect_err("short");
        assert!(matches!(e, PthError::BadTensor { .. }), "{e}");
        let zip = archive(&[("a/data.pkl", &p), ("a/byteorder", b"big")]);
        assert!(matches!(
            read_bytes(&zip, "x.pth"),
            Err(PthError::Corrupt { .. })
        ));
        let zip = archive(&[("a/data.pkl", &p), ("a/data/0", &storage)]);
        for cut in [10, zip.len() / 2, zip.len() - 1] {
            let e = read_bytes(&zip[..cut], "x.pth").expect_err("truncated");
            assert!(matches!(e, PthError::Corrupt { .. }), "{cut}: {e}");
        }
        assert!(matches!(
            read_bytes(
                b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.",
                "x.pth"
            ),
            Err(PthError::Legacy { .. })
        ));
    }
}
