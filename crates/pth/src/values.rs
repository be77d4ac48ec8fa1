//! The restricted unpickler's values: the globals it knows (every other one is refused where
//! the pickle names it), storages, tensor views, stack values and containers, and why a pickle
//! is refused (`Fail`).
use safetensors::Dtype;
use std::collections::HashMap;
use std::rc::Rc;

use crate::error::PthError;

/// What the reader may meet: the only globals a state_dict's pickle names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Global {
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
pub(crate) struct Storage {
    pub(crate) key: Rc<str>,
    pub(crate) elem: Dtype,
    pub(crate) numel: usize,
}

/// A tensor: a view (offset, sizes, strides in elements of `dtype`) of a storage.
#[derive(Debug)]
pub(crate) struct TensorRef {
    pub(crate) storage: Rc<Storage>,
    pub(crate) dtype: Dtype,
    pub(crate) offset: usize,
    pub(crate) size: Vec<usize>,
    pub(crate) stride: Vec<usize>,
}

/// A value on the stack or in the memo; containers live in `Vm::objs` (so values are cheap to
/// copy, sharing is exact, and nothing is dropped recursively).
#[derive(Debug, Clone)]
#[cfg_attr(not(test), allow(dead_code))] // booleans' and floats' values: only tests look
pub(crate) enum V {
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
pub(crate) enum Obj {
    Tuple(Vec<V>),
    List(Vec<V>),
    Dict {
        items: Vec<(V, V)>,
        by_str: HashMap<Rc<str>, usize>,
    },
}

/// Why the pickle is refused (the file's path is added by `into_error`).
#[derive(Debug, PartialEq)]
pub(crate) enum Fail {
    Corrupt(String),
    Global(String),
    WholeModel(String),
    NotAStateDict(String),
    UnsupportedDtype(String),
    Limit(String),
}

impl Fail {
    pub(crate) fn into_error(self, path: &str) -> PthError {
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

pub(crate) fn elem_size(d: Dtype) -> usize {
    match d {
        Dtype::BOOL | Dtype::U8 | Dtype::I8 => 1,
        Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
        Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
        _ => 8,
    }
}

/// `module.name` as the reader knows it; every other global is refused here, before anything
/// could use it.
pub(crate) fn resolve_global(module: &str, name: &str) -> Result<Global, Fail> {
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
pub(crate) fn opcode_name(op: u8) -> &'static str {
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
