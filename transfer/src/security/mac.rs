//! The keyed MAC of `authenticate` mode's data plane: after the mutual-TLS
//! handshake the connection leaves TLS, and every frame (request or
//! response, header and payload) is followed by a 16-byte blake3 keyed hash.
//! The key is exported from the TLS session (RFC 5705), so only the two
//! authenticated ends know it; each direction has its own label and frame
//! counter, so a frame cannot be altered, replayed, reordered or reflected.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::BadInput;
use crate::TransferError;

/// Bytes of the tag after every frame.
pub const TAG_BYTES: usize = 16;
const EXPORT_LABEL: &[u8] = b"EXPORTER-kvfabric-transfer-mac";

/// One connection's MAC state (shared by its reading and writing halves).
pub(crate) struct ConnMac {
    key: [u8; 32],
    client: bool,
    sent: AtomicU64,
    received: AtomicU64,
}

impl ConnMac {
    /// The MAC of a connection whose TLS handshake just completed; `client`
    /// says which end this is.
    pub fn export<D>(
        tls: &rustls::ConnectionCommon<D>,
        client: bool,
    ) -> Result<Self, TransferError> {
        let key = tls
            .export_keying_material([0u8; 32], EXPORT_LABEL, None)
            .map_err(|e| {
                TransferError::InvalidArgument(BadInput::Credentials {
                    what: "tls exporter".into(),
                    reason: e.to_string(),
                })
            })?;
        Ok(ConnMac {
            key,
            client,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
        })
    }

    /// The MAC of one frame from `from_client`'s end, fed its header; the
    /// body follows through [`FrameTag::update`].
    fn start(&self, from_client: bool, seq: u64, head: &[u8]) -> FrameTag {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(if from_client { b"c2s" } else { b"s2c" });
        h.update(&seq.to_le_bytes());
        h.update(&(head.len() as u64).to_le_bytes());
        h.update(head);
        FrameTag(h)
    }

    /// The MAC of the next frame this end sends (header `head`).
    pub fn sending(&self, head: &[u8]) -> FrameTag {
        let seq = self.sent.fetch_add(1, Ordering::Relaxed);
        self.start(self.client, seq, head)
    }

    /// The MAC of the next frame this end receives (header `head`).
    pub fn receiving(&self, head: &[u8]) -> FrameTag {
        let seq = self.received.fetch_add(1, Ordering::Relaxed);
        self.start(!self.client, seq, head)
    }

    /// Count a received frame that is dropped unread (a refused WRITE's).
    pub fn skip_received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }
}

/// One frame's MAC while its body is fed in pieces: a sender hashes each
/// piece just before the socket copies it, a receiver just after the piece
/// lands, so the payload is read from memory once (the hash finds it in
/// cache) and blake3 still sees pieces large enough for its many-chunk SIMD
/// path. The tag is the same as over the whole body at once.
pub(crate) struct FrameTag(blake3::Hasher);

impl FrameTag {
    /// Feed the next piece of the body.
    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The tag of the header and every piece fed.
    pub fn finish(&self) -> [u8; TAG_BYTES] {
        let mut out = [0u8; TAG_BYTES];
        out.copy_from_slice(&self.0.finalize().as_bytes()[..TAG_BYTES]);
        out
    }

    /// Whether `tag` is this frame's (compared in constant time).
    pub fn verify(&self, tag: &[u8; TAG_BYTES]) -> bool {
        // blake3's Hash compares in constant time.
        blake3::Hash::from(pad(self.finish())) == blake3::Hash::from(pad(*tag))
    }
}

#[cfg(test)]
impl ConnMac {
    /// The tag of the next frame this end sends.
    pub fn seal(&self, head: &[u8], body: &[u8]) -> [u8; TAG_BYTES] {
        let mut t = self.sending(head);
        t.update(body);
        t.finish()
    }

    /// Whether `tag` is right for the next frame this end receives.
    pub fn open(&self, head: &[u8], body: &[u8], tag: &[u8; TAG_BYTES]) -> bool {
        let mut t = self.receiving(head);
        t.update(body);
        t.verify(tag)
    }

    /// Two ends of one connection's MAC (client, server), a fixed key.
    pub(crate) fn pair_for_tests() -> (ConnMac, ConnMac) {
        let mk = |client| ConnMac {
            key: [7; 32],
            client,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
        };
        (mk(true), mk(false))
    }
}

fn pad(t: [u8; TAG_BYTES]) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..TAG_BYTES].copy_from_slice(&t);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (ConnMac, ConnMac) {
        ConnMac::pair_for_tests()
    }

    #[test]
    fn frames_verify_once_in_order_and_altered_ones_fail() {
        let (c, s) = pair();
        let t0 = c.seal(b"head", b"body");
        let t1 = c.seal(b"head", b"body");
        assert_ne!(t0, t1, "the counter is in the tag");
        assert!(s.open(b"head", b"body", &t0));
        assert!(!s.open(b"head", b"b0dy", &t1), "altered payload");
        let (c, s) = pair();
        let t = c.seal(b"head", b"body");
        assert!(
            !c.open(b"head", b"body", &t),
            "reflected back to its sender"
        );
        assert!(s.open(b"head", b"body", &t));
        assert!(!s.open(b"head", b"body", &t), "replayed");
    }

    #[test]
    fn a_body_fed_in_pieces_has_the_whole_body_tag() {
        let body: Vec<u8> = (0..300_001u32).map(|i| (i * 31 % 251) as u8).collect();
        let (c, s) = pair();
        let whole = c.seal(b"head", &body);
        let mut t = s.receiving(b"head");
        for piece in body.chunks(65_537) {
            t.update(piece);
        }
        assert!(t.verify(&whole));
        let mut t = c.sending(b"head");
        t.update(&body);
        assert_ne!(t.finish(), whole, "the next frame has the next counter");
    }
}
