//! The memory format of the convolutions: channels-last (NHWC in memory) or PyTorch's default
//! NCHW, chosen by `--channels-last on|off|auto`. `auto` takes the format that was measured
//! faster for the device, the architecture family and the input size (BENCHMARKS.md, "Memory
//! format"): on CUDA channels-last (cuDNN's tensor-core convolutions want NHWC; PyTorch's
//! performance guide); on CPU channels-last only from an input size where oneDNN's NHWC
//! convolutions overtake NCHW, which is later for small feature maps; a Vision Transformer NCHW
//! on every device (one convolution, then matrix products), a Swin Transformer likewise (not
//! measured: its one convolution is all a memory format touches); NCHW for a family not measured on
//! CPU yet (MobileNetV3). Every rank decides alike
//! (the same inputs), so the same-model guarantee holds; the weights written are NCHW either way.
//! Must not know tensors or devices beyond "CUDA or not".
use tchrun::arch::{Arch, Family};
pub use tchrun::layout::ChannelsLast;

/// On CPU, the smallest input side (pixels) from which channels-last was measured faster, per
/// family (`tchrun-worker bench-step --channels-last on|off`, one intra-op thread, batch 16;
/// BENCHMARKS.md "Memory format"): ResNet-18 is 0.73x in channels-last at 32 px, even at 80-96
/// px and 1.03x at 112 px; DenseNet-121 is faster in channels-last at every size measured
/// (1.25x at 32 px, 1.2x at 64 and 112 px).
const CPU_FROM_SIZE_RESNET: i64 = 96;
const CPU_FROM_SIZE_DENSENET: i64 = 0;
/// ConvNeXt: never on CPU. convnext_tiny, ms per step NCHW / channels-last, two runs each
/// interleaved: 32 px 245, 267 / 263, 279; 64 px 674, 889 / 884, 890; 112 px 2247, 2422 /
/// 2395, 2371: channels-last was nowhere faster (its 7x7 depthwise convolutions gain nothing
/// from oneDNN's NHWC kernels and the LayerNorms permute either way).
const CPU_FROM_SIZE_CONVNEXT: i64 = i64::MAX;
/// EfficientNet: channels-last at every size on CPU. efficientnet_b0, ms per step NCHW /
/// channels-last, interleaved pairs: 32 px 236, 251 / 188, 204; 64 px 404, 366 / 303, 201;
/// 112 px 747, 613, 786, 654 / 630, 699, 613, 737 (even, 2800 against 2679 ms in all);
/// efficientnet_v2_s at 64 px 1262 / 1063.
const CPU_FROM_SIZE_EFFICIENTNET: i64 = 0;

/// The decision and the reason, for the driver log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub channels_last: bool,
    pub why: String,
}

impl Layout {
    /// "channels-last (why)" or "NCHW (why)".
    pub fn describe(&self) -> String {
        let name = if self.channels_last {
            "channels-last"
        } else {
            "NCHW"
        };
        format!("{name} ({})", self.why)
    }
}

/// The layout for `arch` at `input_size` on CUDA (`cuda`) or the CPU.
pub fn choose(setting: ChannelsLast, cuda: bool, arch: Arch, input_size: i64) -> Layout {
    let fixed = |on: bool| Layout {
        channels_last: on,
        why: format!("--channels-last {}", setting.as_str()),
    };
    match setting {
        ChannelsLast::On => return fixed(true),
        ChannelsLast::Off => return fixed(false),
        ChannelsLast::Auto => {}
    }
    if let Family::Vit { .. } = arch.family() {
        return Layout {
            channels_last: false,
            why: "--channels-last auto: a Vision Transformer has one convolution, the patch \
                  projection, whose output is reshaped to (batch, patches, hidden) for matrix \
                  products that have no memory format; channels-last would add a copy"
                .into(),
        };
    }
    if let Family::Swin { .. } = arch.family() {
        return Layout {
            channels_last: false,
            why: "--channels-last auto: a Swin Transformer has one convolution, the patch \
                  embedding; the rest (LayerNorms, Linears, window attention) works on (batch, \
                  height, width, channels) tensors that have no memory format, so PyTorch's \
                  default (not measured)"
                .into(),
        };
    }
    if cuda {
        return Layout {
            channels_last: true,
            why: "--channels-last auto: CUDA, cuDNN's NHWC convolutions".into(),
        };
    }
    let (family, from) = match arch.family() {
        Family::Resnet { .. } => ("ResNet", Some(CPU_FROM_SIZE_RESNET)),
        Family::Densenet { .. } => ("DenseNet", Some(CPU_FROM_SIZE_DENSENET)),
        Family::Convnext { .. } => ("ConvNeXt", Some(CPU_FROM_SIZE_CONVNEXT)),
        Family::Efficientnet { .. } => ("EfficientNet", Some(CPU_FROM_SIZE_EFFICIENTNET)),
        // Decided above, on every device.
        Family::Vit { .. } => ("ViT", Some(i64::MAX)),
        Family::Swin { .. } => ("Swin", Some(i64::MAX)),
        // Not measured yet (the machine was shared by four builds when MobileNetV3 came):
        // PyTorch's default.
        Family::Mobilenet { .. } => ("MobileNetV3", None),
        // Not measured yet either (two CPU cores shared by three builds when RegNet came).
        Family::Regnet { .. } => ("RegNet", None),
    };
    let Some(from) = from else {
        return Layout {
            channels_last: false,
            why: format!(
                "--channels-last auto: {family} is not measured on CPU yet, PyTorch's default"
            ),
        };
    };
    let on = input_size >= from;
    if from == i64::MAX {
        return Layout {
            channels_last: false,
            why: format!(
                "--channels-last auto: on CPU {family} runs no faster in channels-last at any \
                 size measured"
            ),
        };
    }
    if from == 0 {
        return Layout {
            channels_last: true,
            why: format!("--channels-last auto: on CPU {family} runs faster in channels-last at every size measured"),
        };
    }
    Layout {
        channels_last: on,
        why: format!(
            "--channels-last auto: on CPU {family} runs faster {} from {from} px, this input is \
             {input_size} px",
            if on {
                "in channels-last"
            } else {
                "in NCHW below, channels-last"
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_device_and_the_measured_size_and_on_off_are_obeyed() {
        let r18 = Arch::from_name("resnet18").expect("resnet18");
        let d121 = Arch::from_name("densenet121").expect("densenet121");
        assert!(choose(ChannelsLast::Auto, true, r18, 32).channels_last);
        assert!(!choose(ChannelsLast::Auto, false, r18, 32).channels_last);
        assert!(choose(ChannelsLast::Auto, false, r18, 224).channels_last);
        assert!(choose(ChannelsLast::Auto, false, d121, 32).channels_last);
        assert!(!choose(ChannelsLast::Auto, false, r18, CPU_FROM_SIZE_RESNET - 1).channels_last);
        assert!(choose(ChannelsLast::Auto, false, r18, CPU_FROM_SIZE_RESNET).channels_last);
        assert!(choose(ChannelsLast::On, false, r18, 32).channels_last);
        assert!(!choose(ChannelsLast::Off, true, r18, 224).channels_last);
        let cnx = Arch::from_name("convnext_tiny").expect("convnext_tiny");
        assert!(choose(ChannelsLast::Auto, true, cnx, 32).channels_last);
        let l = choose(ChannelsLast::Auto, false, cnx, 1024);
        assert_eq!(
            l.describe(),
            "NCHW (--channels-last auto: on CPU ConvNeXt runs no faster in channels-last at any \
             size measured)"
        );
        assert!(choose(ChannelsLast::On, false, cnx, 32).channels_last);
        let b0 = Arch::from_name("efficientnet_b0").expect("efficientnet_b0");
        assert_eq!(
            choose(ChannelsLast::Auto, false, b0, 32).describe(),
            "channels-last (--channels-last auto: on CPU EfficientNet runs faster in \
             channels-last at every size measured)"
        );
        assert!(!choose(ChannelsLast::Off, false, b0, 224).channels_last);
        for cuda in [false, true] {
            let l = choose(ChannelsLast::Auto, cuda, Arch::VitB16, 224);
            assert!(
                !l.channels_last && l.why.contains("patch projection"),
                "{l:?}"
            );
        }
        assert!(choose(ChannelsLast::On, false, Arch::VitB16, 224).channels_last);
        for cuda in [false, true] {
            let l = choose(ChannelsLast::Auto, cuda, Arch::SwinT, 224);
            assert!(
                !l.channels_last && l.why.contains("patch embedding"),
                "{l:?}"
            );
        }
        assert!(choose(ChannelsLast::On, false, Arch::SwinT, 224).channels_last);
        let mv3 = Arch::from_name("mobilenet_v3_small").expect("mobilenet_v3_small");
        assert_eq!(
            choose(ChannelsLast::Auto, false, mv3, 224).describe(),
            "NCHW (--channels-last auto: MobileNetV3 is not measured on CPU yet, PyTorch's \
             default)"
        );
        assert!(choose(ChannelsLast::Auto, true, mv3, 32).channels_last);
        assert!(choose(ChannelsLast::On, false, mv3, 32).channels_last);
        assert_eq!(
            choose(ChannelsLast::Auto, false, Arch::RegnetY400mf, 224).describe(),
            "NCHW (--channels-last auto: RegNet is not measured on CPU yet, PyTorch's default)"
        );
        assert!(choose(ChannelsLast::Auto, true, Arch::RegnetX400mf, 32).channels_last);
        let l = choose(ChannelsLast::Auto, false, r18, 32);
        assert_eq!(
            l.describe(),
            format!(
                "NCHW (--channels-last auto: on CPU ResNet runs faster in NCHW below, \
                 channels-last from {CPU_FROM_SIZE_RESNET} px, this input is 32 px)"
            )
        );
    }
}
