//! The unpickler on hand-made pickles (scalars, containers, memo, refused globals and opcodes,
//! bounds, tensor views) and a whole archive converted to safetensors.
use super::*;
use crate::limits::{MAX_MARKS, MAX_MEMO, MAX_VALUES};
use crate::values::{Fail, Obj, V};

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
