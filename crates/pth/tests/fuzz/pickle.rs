//! Pickles from a grammar: the opcodes the reader knows (each with its argument encodings, a
//! length that may lie, memo indices that may be wrong) and opcodes it refuses, written from a
//! list of `Op`s so a case can be perturbed op by op before it is serialized.
use crate::rng::Rng;

#[derive(Clone, Debug)]
pub enum Op {
    Proto(u8),
    Frame(u64),
    /// `GLOBAL module\nname\n`.
    Global(String, String),
    StackGlobal,
    /// A string; `len` lies about its length when set; `width` 1, 4 or 8 length bytes.
    Str {
        s: Vec<u8>,
        len: Option<u64>,
        width: u8,
    },
    Int(i64),
    /// LONG1 with these bytes (any count: more than 8 is refused).
    Long1(Vec<u8>),
    Float(f64),
    Bool(bool),
    None,
    Mark,
    Tuple,
    /// TUPLE1..TUPLE3.
    TupleN(u8),
    EmptyTuple,
    EmptyDict,
    EmptyList,
    SetItem,
    SetItems,
    Append,
    Appends,
    Reduce,
    NewObj,
    Build,
    BinPersId,
    /// BINPUT (`wide` false, index < 256) or LONG_BINPUT.
    Put(u32, bool),
    Memoize,
    Get(u32, bool),
    Stop,
    /// Any bytes: opcodes the reader refuses, or garbage.
    Raw(Vec<u8>),
}

/// Integers a corrupt file likes to hold.
pub const INTERESTING: &[i64] = &[
    0,
    1,
    -1,
    2,
    7,
    255,
    256,
    65535,
    65536,
    i32::MAX as i64,
    i32::MIN as i64,
    u32::MAX as i64,
    1 << 32,
    1 << 40,
    (1 << 62) - 1,
    i64::MAX,
    i64::MIN,
    i64::MAX / 4 + 1,
];

pub fn interesting(rng: &mut Rng) -> i64 {
    INTERESTING[rng.below(INTERESTING.len())]
}

fn put_int(out: &mut Vec<u8>, v: i64) {
    if (0..256).contains(&v) {
        out.extend_from_slice(&[b'K', v as u8]);
    } else if (0..65536).contains(&v) {
        out.push(b'M');
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if i32::try_from(v).is_ok() {
        out.push(b'J');
        out.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
        out.extend_from_slice(&[0x8a, 8]);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The ops' bytes.
pub fn serialize(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Proto(p) => out.extend_from_slice(&[0x80, *p]),
            Op::Frame(n) => {
                out.push(0x95);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Op::Global(m, n) => {
                out.push(b'c');
                for part in [m, n] {
                    out.extend_from_slice(part.as_bytes());
                    out.push(b'\n');
                }
            }
            Op::StackGlobal => out.push(0x93),
            Op::Str { s, len, width } => {
                let n = len.unwrap_or(s.len() as u64);
                match width {
                    1 => out.extend_from_slice(&[0x8c, n as u8]),
                    4 => {
                        out.push(b'X');
                        out.extend_from_slice(&(n as u32).to_le_bytes());
                    }
                    _ => {
                        out.push(0x8d);
                        out.extend_from_slice(&n.to_le_bytes());
                    }
                }
                out.extend_from_slice(s);
            }
            Op::Int(v) => put_int(&mut out, *v),
            Op::Long1(b) => {
                out.extend_from_slice(&[0x8a, b.len() as u8]);
                out.extend_from_slice(b);
            }
            Op::Float(f) => {
                out.push(b'G');
                out.extend_from_slice(&f.to_be_bytes());
            }
            Op::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
            Op::None => out.push(b'N'),
            Op::Mark => out.push(b'('),
            Op::Tuple => out.push(b't'),
            Op::TupleN(n) => out.push(0x84 + n.clamp(&1, &3)),
            Op::EmptyTuple => out.push(b')'),
            Op::EmptyDict => out.push(b'}'),
            Op::EmptyList => out.push(b']'),
            Op::SetItem => out.push(b's'),
            Op::SetItems => out.push(b'u'),
            Op::Append => out.push(b'a'),
            Op::Appends => out.push(b'e'),
            Op::Reduce => out.push(b'R'),
            Op::NewObj => out.push(0x81),
            Op::Build => out.push(b'b'),
            Op::BinPersId => out.push(b'Q'),
            Op::Put(i, wide) | Op::Get(i, wide) => {
                let get = matches!(op, Op::Get(..));
                if *wide || *i > 255 {
                    out.push(if get { b'j' } else { b'r' });
                    out.extend_from_slice(&i.to_le_bytes());
                } else {
                    out.extend_from_slice(&[if get { b'h' } else { b'q' }, *i as u8]);
                }
            }
            Op::Memoize => out.push(0x94),
            Op::Stop => out.push(b'.'),
            Op::Raw(b) => out.extend_from_slice(b),
        }
    }
    out
}

/// A string op as torch writes one (BINUNICODE).
pub fn s(text: &str) -> Op {
    Op::Str {
        s: text.as_bytes().to_vec(),
        len: None,
        width: 4,
    }
}

pub fn global(m: &str, n: &str) -> Op {
    Op::Global(m.into(), n.into())
}

/// Globals the reader knows, refuses by name, or refuses as a whole model.
const GLOBALS: &[(&str, &str)] = &[
    ("collections", "OrderedDict"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch", "FloatStorage"),
    ("torch", "LongStorage"),
    ("torch", "BoolStorage"),
    ("torch", "HalfStorage"),
    ("torch", "ComplexFloatStorage"),
    ("torch.storage", "UntypedStorage"),
    ("torch", "float32"),
    ("torch", "uint64"),
    ("torch", "complex64"),
    ("torch", "float8_e4m3fn"),
    ("posix", "system"),
    ("builtins", "eval"),
    ("torchvision.models.resnet", "ResNet"),
    ("__main__", "Net"),
    ("", ""),
];

/// Opcodes the reader does not know (or garbage bytes).
const REFUSED: &[u8] = &[
    b'0', b'1', b'2', b'F', b'I', b'L', 0x8b, b'P', b'S', b'T', b'U', b'V', b'B', b'C', 0x8e, 0x96,
    0x97, 0x98, b'd', b'l', b'i', b'o', b'g', b'p', 0x82, 0x83, 0x84, 0x8f, 0x90, 0x91, 0x92, 0x00,
    0xff,
];

/// One random op of the whole grammar.
pub fn random_op(rng: &mut Rng) -> Op {
    match rng.below(34) {
        0 => Op::Proto(rng.below(8) as u8),
        1 => Op::Frame(rng.next()),
        2..=3 => {
            let (m, n) = GLOBALS[rng.below(GLOBALS.len())];
            if rng.chance(4) {
                Op::Global(m.into(), n.into())
            } else {
                Op::Global(format!("{m}{}", rng.below(3)), n.into())
            }
        }
        4 => Op::StackGlobal,
        5..=7 => {
            let long = rng.chance(8);
            let n = rng.below(if long { 5000 } else { 12 });
            let mut s: Vec<u8> = (0..n).map(|_| b'a' + rng.below(26) as u8).collect();
            if rng.chance(16) {
                s.push(0xff); // not UTF-8
            }
            let len = if rng.chance(6) {
                Some(interesting(rng) as u64)
            } else {
                None
            };
            let width = [1, 4, 8][rng.below(3)];
            Op::Str { s, len, width }
        }
        8..=10 => Op::Int(if rng.chance(2) {
            interesting(rng)
        } else {
            rng.below(70) as i64
        }),
        11 => Op::Long1((0..rng.below(11)).map(|_| rng.next() as u8).collect()),
        12 => Op::Float(f64::from_bits(rng.next())),
        13 => Op::Bool(rng.chance(2)),
        14 => Op::None,
        15..=16 => Op::Mark,
        17 => Op::Tuple,
        18 => Op::TupleN(1 + rng.below(3) as u8),
        19 => Op::EmptyTuple,
        20 => Op::EmptyDict,
        21 => Op::EmptyList,
        22 => Op::SetItem,
        23 => Op::SetItems,
        24 => Op::Append,
        25 => Op::Appends,
        26 => {
            if rng.chance(2) {
                Op::Reduce
            } else {
                Op::NewObj
            }
        }
        27 => Op::Build,
        28 => Op::BinPersId,
        29 => Op::Put(memo_index(rng), rng.chance(2)),
        30 => Op::Memoize,
        31 => Op::Get(memo_index(rng), rng.chance(2)),
        32 => Op::Stop,
        _ => Op::Raw(vec![REFUSED[rng.below(REFUSED.len())]]),
    }
}

fn memo_index(rng: &mut Rng) -> u32 {
    if rng.chance(8) {
        interesting(rng) as u32
    } else {
        rng.below(8) as u32
    }
}

/// Opcode soup: `n` random ops, now and then a long run of one op (deep MARKs, many memo
/// entries, many values), ending in STOP most of the time.
pub fn soup(rng: &mut Rng, n: usize) -> Vec<Op> {
    let mut ops = vec![Op::Proto(2)];
    while ops.len() < n {
        let op = random_op(rng);
        let run = if rng.chance(20) { rng.below(3000) } else { 1 };
        for _ in 0..run {
            ops.push(op.clone());
        }
    }
    if !rng.chance(8) {
        ops.push(Op::Stop);
    }
    ops
}

/// Perturbs a list of ops: deletions, duplications, swaps, random ops inserted, an argument
/// replaced by an interesting integer.
pub fn perturb(rng: &mut Rng, ops: &mut Vec<Op>) {
    for _ in 0..1 + rng.below(4) {
        if ops.is_empty() {
            return;
        }
        let i = rng.below(ops.len());
        match rng.below(6) {
            0 => {
                ops.remove(i);
            }
            1 => {
                let op = ops[i].clone();
                ops.insert(i, op);
            }
            2 => {
                let j = rng.below(ops.len());
                ops.swap(i, j);
            }
            3 => ops.insert(i, random_op(rng)),
            4 => ops[i] = random_op(rng),
            _ => {
                if let Some(j) = (i..ops.len()).find(|&j| matches!(ops[j], Op::Int(_))) {
                    ops[j] = Op::Int(interesting(rng));
                }
            }
        }
    }
}
