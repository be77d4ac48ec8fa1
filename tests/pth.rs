//! `tchrun model init --weights FILE.pth` (issue 13): a state_dict saved by `torch.save` is
//! read without libtorch, Python or the network by a restricted unpickler (`tchrun::pth`) that
//! runs nothing from the file, checked like a safetensors one, and written into the model
//! directory as `model.safetensors` equal to the original tensor for tensor. Pickles that call
//! code, whole pickled models, truncated and legacy files, another architecture's weights and
//! integer weights are refused with exit 2, naming the file and the fix, with nothing written.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// Runs Python code (torch and torchvision imported, `D` the directory) to its end.
fn py(dir: &Path, code: &str) -> Run {
    let code = format!(
        "import os, collections, torch, torchvision\n\
         D = {:?}\n\
         torch.manual_seed(0)\n\
         {code}",
        dir.display().to_string()
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    r
}

/// A refusal: exit 2, the file named, every `needle` said, nothing written in `out`.
fn assert_refused(r: &Run, file: &str, needles: &[&str], out: &Path) {
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(file),
        "the file is named: {}",
        r.explain()
    );
    for n in needles {
        assert!(r.stderr.contains(n), "'{n}' is said: {}", r.explain());
    }
    assert!(
        !out.join("model.json").exists() && !out.join("model.safetensors").exists(),
        "nothing may be written on a refusal: {}",
        r.explain()
    );
}

/// Python compares the written `model.safetensors` with the `.pth` it came from: the same
/// names, dtypes, shapes and values (torch.equal).
fn assert_same_tensors(pth: &Path, converted: &Path) {
    let code = format!(
        "import torch\n\
         from safetensors.torch import load_file\n\
         a = torch.load({:?}, weights_only=True)\n\
         b = load_file({:?})\n\
         assert set(a) == set(b), set(a) ^ set(b)\n\
         for k in a:\n\
         \x20   assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k\n\
         \x20   assert torch.equal(a[k], b[k]), k\n\
         print('equal', len(a))\n",
        pth.display().to_string(),
        converted.display().to_string()
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

#[test]
fn pth_state_dicts_convert_exactly() {
    let t = tempdir();
    py(
        t.path(),
        "torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), D + '/r18.pth')\n\
         d = torchvision.models.densenet121(num_classes=3)\n\
         d.features.norm0.num_batches_tracked += 7\n\
         torch.save(d.state_dict(), D + '/d121.pt')\n",
    );
    for (arch, file, classes, tensors) in [
        ("resnet18", "r18.pth", 10, 122),
        ("densenet121", "d121.pt", 3, 727),
    ] {
        let pth = t.path().join(file);
        let out = t.path().join(arch);
        let r = run(&mut init_with_weights(arch, &pth, &out), LIMIT);
        assert_eq!(r.code, Some(0), "{}", r.explain());
        assert_same_tensors(&pth, &out.join("model.safetensors"));
        let cfg: serde_json::Value =
            serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
        let w = &cfg["initial_weights"];
        assert_eq!(w["file"], file);
        assert_eq!(w["format"], "pth");
        assert_eq!(w["head_classes"], classes);
        assert_eq!(w["tensors"], tensors);
        assert_eq!(
            w["sha256"].as_str(),
            Some(tchrun::weights::sha256_file(&pth).expect("sha256").as_str()),
            "the sha256 of the file given, not of the conversion"
        );
        // The model directory passes the training pre-flight's check as it is.
        let info = tchrun::weights::check(
            tchrun::model::Arch::from_name(arch).expect("arch"),
            &out.join("model.safetensors"),
        )
        .expect("the converted file checks");
        assert_eq!(info.format, tchrun::weights::Format::Safetensors);
        assert_eq!(info.head_classes, classes);
    }
}

/// Views (transposes, slices with steps, offsets into a shared storage) come out as their
/// contiguous copies, in every dtype a state_dict holds.
#[test]
fn pth_views_read_as_contiguous_copies() {
    let t = tempdir();
    py(
        t.path(),
        "from safetensors.torch import save_file\n\
         x = torch.randn(5, 7)\n\
         sd = collections.OrderedDict()\n\
         sd['t'] = x.t()\n\
         sd['s'] = x[1:, ::3]\n\
         sd['row'] = x[2]\n\
         sd['elem'] = x[3, 4]\n\
         sd['x'] = x\n\
         sd['empty'] = x[:0]\n\
         sd['h'] = torch.randn(4, 6).half()[:, 1::2]\n\
         sd['bf'] = torch.randn(3, 3).bfloat16().t()\n\
         sd['d'] = torch.randn(2, 3, 4).double().permute(2, 0, 1)\n\
         sd['i'] = torch.arange(12).reshape(3, 4)[:, 1:3]\n\
         sd['n'] = torch.tensor(5)\n\
         sd['b'] = torch.tensor([True, False, True])\n\
         sd['u8'] = torch.arange(10, dtype=torch.uint8)[::2]\n\
         sd['p'] = torch.nn.Parameter(torch.randn(3, 2)).t()\n\
         sd['param'] = torch.nn.Parameter(torch.randn(2, 2))\n\
         torch.save(sd, D + '/views.pth')\n\
         torch.save(sd, D + '/views4.pth', pickle_protocol=4)\n\
         save_file({k: v.detach().clone().contiguous() for k, v in sd.items()}, D + '/want.safetensors')\n",
    );
    let want_bytes = std::fs::read(t.path().join("want.safetensors")).expect("want");
    let want = safetensors::SafeTensors::deserialize(&want_bytes).expect("safetensors");
    // Protocol 2 (torch.save's) and 4 (STACK_GLOBAL, MEMOIZE, FRAME) read alike.
    let sd = tchrun::pth::read(&t.path().join("views.pth")).expect("reads");
    let sd4 = tchrun::pth::read(&t.path().join("views4.pth")).expect("reads");
    assert_eq!(sd, sd4);
    let names: Vec<&str> = sd.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "t", "s", "row", "elem", "x", "empty", "h", "bf", "d", "i", "n", "b", "u8", "p",
            "param"
        ],
        "the file's order"
    );
    for t in &sd.tensors {
        let w = want.tensor(&t.name).expect("expected tensor");
        assert_eq!(t.dtype, w.dtype(), "{}", t.name);
        assert_eq!(t.shape, w.shape(), "{}", t.name);
        assert_eq!(t.data, w.data(), "{}", t.name);
    }
    // And as safetensors: what model init writes.
    let bytes = sd.to_safetensors().expect("serializes");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    assert_eq!(st.len(), want.len());
    for (name, w) in want.tensors() {
        assert_eq!(st.tensor(&name).expect("tensor").data(), w.data(), "{name}");
    }
}

/// A pickle that would run `touch MARKER` (os.system through `__reduce__`, as `torch.load`
/// with weights_only=False would run it) is refused by name; nothing runs, nothing is written.
#[test]
fn pth_with_code_is_refused_and_nothing_runs() {
    let t = tempdir();
    let marker = t.path().join("MARKER");
    let marker2 = t.path().join("MARKER2");
    py(
        t.path(),
        "class System:\n\
         \x20   def __reduce__(self):\n\
         \x20       return (os.system, ('touch ' + D + '/MARKER',))\n\
         class Eval:\n\
         \x20   def __reduce__(self):\n\
         \x20       return (eval, (\"__import__('os').system('touch %s/MARKER2')\" % D,))\n\
         sd = torchvision.models.resnet18(num_classes=10).state_dict()\n\
         sd['fc.bias'] = System()\n\
         torch.save(sd, D + '/system.pth')\n\
         torch.save({'conv1.weight': Eval()}, D + '/eval.pth')\n",
    );
    assert!(!marker.exists() && !marker2.exists());
    for (file, global, m) in [
        ("system.pth", "posix.system", &marker),
        ("eval.pth", "__builtin__.eval", &marker2),
    ] {
        let out = t.path().join("out");
        let r = run(
            &mut init_with_weights("resnet18", &t.path().join(file), &out),
            LIMIT,
        );
        assert_refused(
            &r,
            file,
            &[
                global,
                "runs nothing from the file",
                "torch.save(model.state_dict(), PATH)",
            ],
            &out,
        );
        assert!(
            !out.exists(),
            "not even the output directory: {}",
            r.explain()
        );
        assert!(!m.exists(), "the pickle's code ran: {}", r.explain());
    }
    // The files are armed: unpickled by Python, they do run their code.
    let r = run(
        python().arg("-c").arg(format!(
            "import torch\n\
             for f in ['system.pth', 'eval.pth']:\n\
             \x20   torch.load({:?} + '/' + f, weights_only=False)\n",
            t.path().display().to_string()
        )),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(marker.exists() && marker2.exists(), "{}", r.explain());
}

#[test]
fn pth_refusals_name_the_file_and_the_fix() {
    let t = tempdir();
    py(
        t.path(),
        "m = torchvision.models.resnet18(num_classes=10)\n\
         sd = m.state_dict()\n\
         torch.save(m, D + '/whole.pth')\n\
         torch.save(sd, D + '/legacy.pth', _use_new_zipfile_serialization=False)\n\
         torch.save(sd, D + '/full.pth')\n\
         torch.save(torchvision.models.resnet34(num_classes=10).state_dict(), D + '/r34.pth')\n\
         bad = dict(sd)\n\
         bad['conv1.weight'] = bad['conv1.weight'].long()\n\
         torch.save(bad, D + '/int64.pth')\n\
         torch.save({'epoch': 3, 'state_dict': sd}, D + '/checkpoint.pth')\n\
         torch.save([sd], D + '/list.pth')\n\
         torch.save({'module.' + k: v for k, v in sd.items()}, D + '/ddp.pth')\n",
    );
    let full = std::fs::read(t.path().join("full.pth")).expect("pth");
    std::fs::write(t.path().join("cut.pth"), &full[..full.len() / 2]).expect("write");
    std::fs::write(t.path().join("head.pth"), &full[..100]).expect("write");
    let out = t.path().join("out");
    for (file, arch, needles) in [
        (
            "whole.pth",
            "resnet18",
            &[
                "whole pickled model (torchvision.models.resnet.ResNet)",
                "save model.state_dict() instead",
            ][..],
        ),
        (
            "cut.pth",
            "resnet18",
            &["not a complete torch.save archive", "truncated"],
        ),
        (
            "head.pth",
            "resnet18",
            &["not a complete torch.save archive"],
        ),
        (
            "legacy.pth",
            "resnet18",
            &["legacy torch file", "torch.save(torch.load(F), F2)"],
        ),
        (
            "r34.pth",
            "resnet18",
            &["looks like a resnet34 state_dict: use --arch resnet34"],
        ),
        (
            "r34.pth",
            "densenet121",
            &["looks like a resnet34 state_dict: use --arch resnet34"],
        ),
        (
            "int64.pth",
            "resnet18",
            &["tensor 'conv1.weight' is I64", "must be floating point"],
        ),
        (
            "checkpoint.pth",
            "resnet18",
            &["checkpoint", "torch.save(checkpoint['state_dict'], PATH)"],
        ),
        (
            "list.pth",
            "resnet18",
            &["holds a list", "not a state_dict"],
        ),
        (
            "ddp.pth",
            "resnet18",
            &["starts with 'module.'", "model.module.state_dict()"],
        ),
    ] {
        let r = run(
            &mut init_with_weights(arch, &t.path().join(file), &out),
            LIMIT,
        );
        assert_refused(&r, file, needles, &out);
    }
    // The untouched file is accepted (the refusals above are the file's, not the setup's).
    let r = run(
        &mut init_with_weights("resnet18", &t.path().join("full.pth"), &out),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

/// Model init reads a `.pth` with no network at all: in a new network namespace (no
/// interface up), it succeeds.
#[test]
fn model_init_pth_needs_no_network() {
    let probe = Command::new("unshare").args(["-n", "true"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        skip_or_fail(&format!(
            "cannot make a network namespace here (unshare -n: {why})"
        ));
        return;
    }
    let t = tempdir();
    py(
        t.path(),
        "torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), D + '/r18.pth')\n",
    );
    // Inside the namespace only the loopback exists, and it is down.
    let r = run(
        Command::new("unshare").args(["-n", "cat", "/proc/net/dev"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let ifaces: Vec<&str> = r
        .stdout
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "{}", r.explain());

    let out = t.path().join("m");
    let cmd = init_with_weights("resnet18", &t.path().join("r18.pth"), &out);
    let mut c = Command::new("unshare");
    c.arg("-n").arg(cmd.get_program()).args(cmd.get_args());
    let r = run(&mut c, LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_same_tensors(&t.path().join("r18.pth"), &out.join("model.safetensors"));
}
