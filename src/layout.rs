//! `--channels-last on|off|auto`: the memory format of the convolutions the user asked for.
//! The choice `auto` makes (by device, architecture family and input size) is the worker's
//! (`worker/src/layout.rs`).

crate::value_enum_serde!(ChannelsLast);

/// `--channels-last`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ChannelsLast {
    /// Channels-last for every convolution weight and input batch.
    On,
    /// PyTorch's default NCHW.
    Off,
    /// The faster of the two for this device, architecture and input size, as measured.
    #[default]
    Auto,
}

impl ChannelsLast {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelsLast::On => "on",
            ChannelsLast::Off => "off",
            ChannelsLast::Auto => "auto",
        }
    }
}
