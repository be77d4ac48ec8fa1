//! Crashers the fuzzer found, kept as named tests: each made the reader allocate far past
//! the bound for its input's size (or refuse a valid file) before its fix.
use crate::pickle::{global, s, serialize, Op};
use crate::zipw::{write, Entry, Tail};
use crate::{check, exclusive, Tally};

/// `_rebuild_tensor_v2` of a uint8 storage `key` of `n` elements: `offset`, `sizes`, strides
/// all 1.
fn tensor(key: &str, n: i64, offset: i64, sizes: &[i64]) -> Vec<Op> {
    let mut ops = vec![
        global("torch._utils", "_rebuild_tensor_v2"),
        Op::Mark,
        Op::Mark,
    ];
    ops.extend([
        s("storage"),
        global("torch", "ByteStorage"),
        s(key),
        s("cpu"),
    ]);
    ops.extend([
        Op::Int(n),
        Op::Tuple,
        Op::BinPersId,
        Op::Int(offset),
        Op::Mark,
    ]);
    ops.extend(sizes.iter().map(|&d| Op::Int(d)));
    ops.extend([Op::Tuple, Op::Mark]);
    ops.extend(sizes.iter().map(|_| Op::Int(1)));
    ops.extend([Op::Tuple, Op::Bool(false), Op::None, Op::Tuple, Op::Reduce]);
    ops
}

/// A state dict of `(name, tensor ops)`.
fn state_dict(tensors: Vec<(String, Vec<Op>)>) -> Vec<Op> {
    let mut ops = vec![Op::Proto(2), Op::EmptyDict, Op::Mark];
    for (name, t) in tensors {
        ops.push(s(&name));
        ops.extend(t);
    }
    ops.extend([Op::SetItems, Op::Stop]);
    ops
}

fn one_tensor(name: &str, key: &str, n: i64, offset: i64) -> Vec<Op> {
    state_dict(vec![(name.into(), tensor(key, n, offset, &[1]))])
}

fn run(file: &[u8], pickle: usize) -> Result<tchrun_pth::StateDict, tchrun_pth::PthError> {
    let _one = exclusive();
    check(9, 0, 0, file, pickle, &mut Tally::default())
}

/// The zip64 end record claims nearly one entry per byte: `zip` 0.6 reserved a ~176-byte
/// record for each (an 11 MB request for a 64 KB file; 1.3 GB for a 6 MB one) before reading
/// any. The reader now refuses a count the file cannot hold (46 bytes a central header).
#[test]
fn a_directory_claiming_an_entry_per_byte_is_refused_before_it_is_reserved() {
    let pkl = serialize(&one_tensor("w", "0", 1, 0));
    let p = pkl.len();
    let entries = [
        Entry::new("archive/data.pkl", pkl),
        Entry::new("archive/data/0", vec![7u8; 64 << 10]),
    ];
    let honest = write(
        &entries,
        Tail {
            zip64: true,
            count: None,
        },
    );
    assert!(run(&honest, p).is_ok());
    let count = Some(honest.len() as u64 - 200);
    let lying = write(&entries, Tail { zip64: true, count });
    let err = run(&lying, p).expect_err("refused").to_string();
    assert!(err.contains("more than its"), "{err}");
}

/// `data.pkl` declares 60 MiB in a 300-byte archive: the reader reserved the declared size
/// (its limit was 64 MiB whatever the file's size). An entry is stored in the file, so it is
/// now capped by the file's size.
#[test]
fn a_pickle_declaring_more_than_the_file_is_refused_before_it_is_reserved() {
    let pkl = serialize(&one_tensor("w", "0", 1, 0));
    let p = pkl.len();
    let mut e = Entry::new("archive/data.pkl", pkl);
    e.declared = Some(60 << 20);
    let file = write(&[e, Entry::new("archive/data/0", vec![1])], Tail::default());
    let err = run(&file, p).expect_err("refused").to_string();
    assert!(err.contains("can still hold"), "{err}");
}

/// 400 storages whose central directory entries all point at one 256 KiB entry: each was
/// read in full (100 MB held for a 310 KB file, quadratic in the file's size). The storages
/// read may now hold no more than the file.
#[test]
fn storages_sharing_one_entry_cannot_claim_more_than_the_file() {
    let n = 400;
    let ops = state_dict(
        (0..n)
            .map(|k| (format!("t{k}"), tensor(&k.to_string(), 256 << 10, k, &[1])))
            .collect(),
    );
    let pkl = serialize(&ops);
    let p = pkl.len();
    let mut entries = vec![
        Entry::new("archive/data.pkl", pkl),
        Entry::new("archive/data/0", vec![3u8; 256 << 10]),
    ];
    for k in 1..n {
        let mut e = Entry::new(format!("archive/data/{k}"), Vec::new());
        e.alias_of = Some(1);
        entries.push(e);
    }
    let file = write(&entries, Tail::default());
    let err = run(&file, p).expect_err("refused").to_string();
    assert!(err.contains("can still hold"), "{err}");
}

/// A view with a zero size is empty whatever its other sizes: `[3, i64::MAX, 5, 0]` was
/// refused as "too many elements" (the product overflowed before it reached the 0), while
/// `[0, 3, i64::MAX, 5]` was read.
#[test]
fn an_empty_view_is_empty_whatever_its_other_sizes() {
    let sizes = [3, i64::MAX, 5, 0];
    let ops = state_dict(vec![("w".into(), tensor("0", 4, 0, &sizes))]);
    let pkl = serialize(&ops);
    let p = pkl.len();
    let file = write(
        &[
            Entry::new("archive/data.pkl", pkl),
            Entry::new("archive/data/0", vec![0; 4]),
        ],
        Tail::default(),
    );
    let sd = run(&file, p).expect("read");
    assert_eq!(sd.tensors[0].shape, [3, i64::MAX as usize, 5, 0]);
    assert!(sd.tensors[0].data.is_empty());
}
