//! Initial weights must be finite: the first tensor of a safetensors file holding a NaN or an
//! infinity, named (`weights::load` refuses it).
use safetensors::{Dtype, SafeTensors};

/// The first floating-point tensor of a safetensors file holding a NaN or an infinity, in
/// words: initial weights that are not finite make the first loss NaN, which training would
/// report as a divergence ("lower --lr"); they are refused here naming the tensor.
pub fn first_non_finite(safetensors: &[u8]) -> Result<Option<String>, String> {
    let st = SafeTensors::deserialize(safetensors).map_err(|e| format!("{e:?}"))?;
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, view) in tensors {
        let data = view.data();
        let bad = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
            Dtype::F64 => data
                .chunks_exact(8)
                .position(|c| !f64::from_le_bytes(c.try_into().unwrap_or([0; 8])).is_finite()),
            // All exponent bits set: an infinity or a NaN.
            Dtype::F16 => (data.chunks_exact(2))
                .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
            Dtype::BF16 => (data.chunks_exact(2))
                .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
            _ => None,
        };
        if let Some(i) = bad {
            return Ok(Some(format!(
                "tensor {name} holds a NaN or an infinity (element {i}); initial weights must \
                 be finite: give the weights of a run that did not diverge"
            )));
        }
    }
    Ok(None)
}
