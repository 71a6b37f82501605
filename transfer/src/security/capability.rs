//! Read capabilities: what a holder hands a reader with a lease, and what
//! the reader must show with every remote READ in a secured mode. A
//! capability names one range of one segment, an expiry, and the reader it
//! was issued to (a hash of its node id), MAC'd with a key only the holder
//! has (blake3 keyed hash). The transfer server refuses a READ that no valid
//! capability of the connection's authenticated peer covers.

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::BadInput;
use crate::TransferError;

/// Bytes of an encoded [`Capability`].
pub const CAPABILITY_BYTES: usize = 72;
const MAC_BYTES: usize = 16;

/// A holder's grant: `reader` may READ `segment[offset..offset+len]` until `expires_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    /// The holder's id of the grant (its lease id): revoked when the lease ends.
    pub id: u64,
    pub segment: u64,
    pub offset: u64,
    pub len: u64,
    /// Expiry, milliseconds since the Unix epoch (holder's clock).
    pub expires_ms: u64,
    /// [`reader_tag`] of the reader's node id.
    pub reader: [u8; 16],
    pub mac: [u8; MAC_BYTES],
}

/// The 16-byte tag of a reader's node id carried in its capabilities.
pub fn reader_tag(node_id: &str) -> [u8; 16] {
    let h = blake3::Hasher::new_derive_key("kvfabric capability reader")
        .update(node_id.as_bytes())
        .finalize();
    let mut t = [0u8; 16];
    t.copy_from_slice(&h.as_bytes()[..16]);
    t
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Capability {
    pub fn encode(&self) -> [u8; CAPABILITY_BYTES] {
        let mut b = [0u8; CAPABILITY_BYTES];
        b[..40].copy_from_slice(&self.body());
        b[40..56].copy_from_slice(&self.reader);
        b[56..].copy_from_slice(&self.mac);
        b
    }

    /// Decode; None unless exactly [`CAPABILITY_BYTES`] long.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != CAPABILITY_BYTES {
            return None;
        }
        let w = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_le_bytes(a)
        };
        let mut reader = [0u8; 16];
        reader.copy_from_slice(&b[40..56]);
        let mut mac = [0u8; MAC_BYTES];
        mac.copy_from_slice(&b[56..]);
        Some(Capability {
            id: w(0),
            segment: w(1),
            offset: w(2),
            len: w(3),
            expires_ms: w(4),
            reader,
            mac,
        })
    }

    fn body(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        for (i, v) in [
            self.id,
            self.segment,
            self.offset,
            self.len,
            self.expires_ms,
        ]
        .iter()
        .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Whether `[offset, offset+len)` of `segment` lies inside this grant.
    pub fn covers(&self, segment: u64, offset: u64, len: u64) -> bool {
        let end = offset.checked_add(len);
        let grant_end = self.offset.checked_add(self.len);
        segment == self.segment
            && offset >= self.offset
            && matches!((end, grant_end), (Some(e), Some(g)) if e <= g)
    }
}

/// A holder's capability key: random per process, never leaves it.
pub struct CapabilityKey([u8; 32]);

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(..)")
    }
}

impl CapabilityKey {
    /// A fresh key from the kernel's random source.
    pub fn random() -> Result<Self, TransferError> {
        let mut k = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut k))
            .map_err(|e| {
                TransferError::InvalidArgument(BadInput::Credentials {
                    what: "/dev/urandom".into(),
                    reason: e.to_string(),
                })
            })?;
        Ok(CapabilityKey(k))
    }

    fn mac(&self, body: &[u8; 40], reader: &[u8; 16]) -> [u8; MAC_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(body);
        h.update(reader);
        let mut m = [0u8; MAC_BYTES];
        m.copy_from_slice(&h.finalize().as_bytes()[..MAC_BYTES]);
        m
    }

    /// Grant `reader` READ of `segment[offset..offset+len]` for `ttl`, as grant `id`.
    pub fn issue(
        &self,
        id: u64,
        segment: u64,
        offset: u64,
        len: u64,
        ttl: Duration,
        reader: &str,
    ) -> Capability {
        let mut c = Capability {
            id,
            segment,
            offset,
            len,
            expires_ms: now_ms().saturating_add(ttl.as_millis() as u64),
            reader: reader_tag(reader),
            mac: [0; MAC_BYTES],
        };
        c.mac = self.mac(&c.body(), &c.reader);
        c
    }

    /// Ok when `cap` is ours, unexpired, issued to `reader` and covers the
    /// range; else why not.
    pub fn check(
        &self,
        cap: &Capability,
        reader: &str,
        segment: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), &'static str> {
        let want = self.mac(&cap.body(), &cap.reader);
        if blake3::Hash::from(pad(want)) != blake3::Hash::from(pad(cap.mac)) {
            return Err("capability MAC does not verify");
        }
        if cap.reader != reader_tag(reader) {
            return Err("capability was issued to another reader");
        }
        if now_ms() >= cap.expires_ms {
            return Err("capability expired");
        }
        if !cap.covers(segment, offset, len) {
            return Err("read outside the capability's range");
        }
        Ok(())
    }
}

fn pad(t: [u8; MAC_BYTES]) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..MAC_BYTES].copy_from_slice(&t);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_refuse_forgery_other_readers_expiry_and_strays() {
        let k = CapabilityKey::random().unwrap();
        let c = k.issue(1, 3, 4096, 8192, Duration::from_secs(60), "b");
        assert_eq!(Capability::decode(&c.encode()), Some(c));
        assert!(k.check(&c, "b", 3, 4096, 8192).is_ok());
        assert!(k.check(&c, "b", 3, 8192, 4096).is_ok(), "a sub-range");
        assert!(k.check(&c, "c", 3, 4096, 8192).is_err(), "another reader");
        assert!(k.check(&c, "b", 3, 4096, 8193).is_err(), "past the end");
        assert!(k.check(&c, "b", 4, 4096, 10).is_err(), "another segment");
        assert!(k.check(&c, "b", 3, u64::MAX, 2).is_err(), "overflow");
        let widened = Capability { len: 1 << 30, ..c };
        assert!(k.check(&widened, "b", 3, 4096, 1 << 20).is_err(), "forged");
        let other = CapabilityKey::random().unwrap();
        assert!(
            other.check(&c, "b", 3, 4096, 8192).is_err(),
            "another holder's"
        );
        let old = k.issue(2, 3, 0, 10, Duration::ZERO, "b");
        assert!(k.check(&old, "b", 3, 0, 10).is_err(), "expired");
        assert!(Capability::decode(&[0u8; 71]).is_none());
    }
}
