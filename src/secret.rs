//! The job's secret and the rendezvous handshake's proofs: 32 random bytes made per attempt
//! (`JobSecret::generate`), carried by `TCHRUN_JOB_SECRET` only (never argv, a log or a file),
//! and the HMAC-SHA256 challenge-response both sides of the rendezvous compute over it. Owns
//! no socket: the worker's `comm::rendezvous` speaks the protocol.
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// The bytes of a secret.
pub const SECRET_BYTES: usize = 32;
/// The bytes of a nonce and of a proof.
pub const NONCE_BYTES: usize = 32;
/// What opens every handshake message (protocol and version), so that a stranger speaking
/// another protocol is told apart from a wrong proof.
pub const MAGIC: &[u8; 8] = b"TCHRV\x001\n";

/// A secret that could not be read from the environment.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{var} must be 64 hexadecimal digits (32 bytes); it has {len} character(s)")]
    Malformed { var: &'static str, len: usize },
}

/// The job's secret. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

/// Who sends a proof: the two directions are keyed apart, so a proof cannot be reflected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The rank that connects (its relay).
    Client,
    /// Rank 0's front.
    Server,
}

impl JobSecret {
    /// 32 bytes from the operating system's generator.
    pub fn generate() -> JobSecret {
        let mut b = [0u8; SECRET_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut b);
        JobSecret(b)
    }

    pub fn from_bytes(b: [u8; SECRET_BYTES]) -> JobSecret {
        JobSecret(b)
    }

    pub fn bytes(&self) -> &[u8; SECRET_BYTES] {
        &self.0
    }

    /// The value of `TCHRUN_JOB_SECRET`.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads `TCHRUN_JOB_SECRET`'s value.
    pub fn from_hex(text: &str) -> Result<JobSecret, SecretError> {
        let bad = || SecretError::Malformed {
            var: crate::env::TCHRUN_JOB_SECRET,
            len: text.chars().count(),
        };
        let t = text.trim();
        if t.len() != 2 * SECRET_BYTES || !t.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; SECRET_BYTES];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(JobSecret(b))
    }

    /// `TCHRUN_JOB_SECRET` of this process's environment, if set.
    pub fn from_env() -> Result<Option<JobSecret>, SecretError> {
        match std::env::var(crate::env::TCHRUN_JOB_SECRET) {
            Ok(v) => JobSecret::from_hex(&v).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// The proof `side` sends: HMAC-SHA256 over the side's label and both nonces (the
    /// server's challenge first).
    pub fn prove(
        &self,
        side: Side,
        server_nonce: &[u8; NONCE_BYTES],
        client_nonce: &[u8; NONCE_BYTES],
    ) -> [u8; NONCE_BYTES] {
        self.mac(side, server_nonce, client_nonce)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is `side`'s proof for these nonces (compared in constant time).
    pub fn verify(
        &self,
        side: Side,
        server_nonce: &[u8; NONCE_BYTES],
        client_nonce: &[u8; NONCE_BYTES],
        proof: &[u8],
    ) -> bool {
        self.mac(side, server_nonce, client_nonce)
            .verify_slice(proof)
            .is_ok()
    }

    fn mac(
        &self,
        side: Side,
        server_nonce: &[u8; NONCE_BYTES],
        client_nonce: &[u8; NONCE_BYTES],
    ) -> Hmac<Sha256> {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(match side {
            Side::Client => b"tchrun rendezvous client",
            Side::Server => b"tchrun rendezvous server",
        });
        mac.update(server_nonce);
        mac.update(client_nonce);
        mac
    }
}

/// A fresh nonce.
pub fn nonce() -> [u8; NONCE_BYTES] {
    let mut b = [0u8; NONCE_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_refusals() {
        let s = JobSecret::generate();
        assert_eq!(JobSecret::from_hex(&s.to_hex()).unwrap(), s);
        assert_ne!(JobSecret::generate(), s, "two secrets are never equal");
        assert!(JobSecret::from_hex("abc").is_err());
        assert!(JobSecret::from_hex(&"zz".repeat(32)).is_err());
        assert!(!format!("{s:?}").contains(&s.to_hex()[..8]));
    }

    #[test]
    fn proofs_bind_the_secret_the_side_and_both_nonces() {
        let s = JobSecret::generate();
        let (a, b) = (nonce(), nonce());
        let p = s.prove(Side::Client, &a, &b);
        assert!(s.verify(Side::Client, &a, &b, &p));
        assert!(
            !s.verify(Side::Server, &a, &b, &p),
            "a proof is not reflected"
        );
        assert!(!s.verify(Side::Client, &b, &a, &p));
        assert!(!JobSecret::generate().verify(Side::Client, &a, &b, &p));
        assert!(!s.verify(Side::Client, &a, &b, &p[..31]));
    }
}
