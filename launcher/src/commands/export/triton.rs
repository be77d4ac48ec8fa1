//! A Triton model's `config.pbtxt` (protobuf text format of Triton's `ModelConfig`): name,
//! platform, max batch size, the input and output with their data types and dims (the batch
//! axis left out when Triton batches), and the class-label file of the output.
use tchrun::export::{Batch, Preprocess, Target, LABELS_TXT, TRITON_MAX_BATCH};

/// `config.pbtxt` of the model `name` exported as `target`.
pub fn config_pbtxt(
    name: &str,
    target: Target,
    pre: &Preprocess,
    batch: Batch,
    with_preprocess: bool,
) -> String {
    let (input, output) = target.io_names();
    let side = pre.crop;
    let (max_batch, lead) = match batch {
        // Triton adds the batch axis itself.
        Batch::Dynamic => (TRITON_MAX_BATCH, String::new()),
        // A fixed batch: no batching by Triton, the batch is part of the dims.
        Batch::Fixed(n) => (0, format!("{n}, ")),
    };
    let (in_type, in_dims, format) = if with_preprocess {
        (
            "TYPE_UINT8",
            format!("[ {lead}{side}, {side}, 3 ]"),
            "FORMAT_NHWC",
        )
    } else {
        (
            "TYPE_FP32",
            format!("[ {lead}3, {side}, {side} ]"),
            "FORMAT_NCHW",
        )
    };
    let classes = pre.class_names.len();
    let out_dims = format!("[ {lead}{classes} ]");
    format!(
        "# Written by tchrun export: {arch}, {classes} classes; preprocessing in {pre_file}.\n\
         name: \"{name}\"\n\
         platform: \"{platform}\"\n\
         max_batch_size: {max_batch}\n\
         input [\n  {{\n    name: \"{input}\"\n    data_type: {in_type}\n    format: {format}\n    dims: {in_dims}\n  }}\n]\n\
         output [\n  {{\n    name: \"{output}\"\n    data_type: TYPE_FP32\n    dims: {out_dims}\n    label_filename: \"{LABELS_TXT}\"\n  }}\n]\n\
         instance_group [\n  {{\n    kind: KIND_AUTO\n  }}\n]\n",
        arch = pre.arch,
        pre_file = tchrun::export::PREPROCESS_JSON,
        platform = target.platform(),
    )
}

/// `labels.txt`: one class name a line, in the output's order.
pub fn labels(pre: &Preprocess) -> String {
    let mut s = String::new();
    for c in &pre.class_names {
        s.push_str(&c.replace(['\n', '\r'], " "));
        s.push('\n');
    }
    s
}
