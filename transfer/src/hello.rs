//! The hello: what an engine says about itself when a connection opens
//! (process id, kernel boot id, shm socket name, whether it has an RDMA NIC),
//! and its fixed-size wire form.
//!
//! Every transport decision starts from a hello (same boot id: shm; both
//! have a NIC: rdma), so it lives outside the transports, which all read it.

use crate::error::BadInput;
use crate::TransferError;

/// "KVFT".
pub const MAGIC: u32 = 0x5446_564b;
/// Protocol version; a peer with another version is refused at hello.
pub const VERSION: u16 = 1;

const BOOT_ID_BYTES: usize = 48;
const SOCKET_BYTES: usize = 64;
/// Size of an encoded [`Hello`].
pub const HELLO_BYTES: usize = 12 + BOOT_ID_BYTES + SOCKET_BYTES;
/// Hello flag: this engine has an RDMA device and accepts queue pairs.
const HELLO_RDMA: u8 = 1;
/// Hello flag: this engine's tcp server answers `FLAG_ENCODE` READs (wire
/// compression). A peer without it is never sent the flag.
const HELLO_WIRE_CODEC: u8 = 2;

/// Identity exchanged when a connection opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub pid: u32,
    pub boot_id: String,
    pub shm_socket: String,
    /// The engine has an RDMA device (older peers send 0: no).
    pub rdma: bool,
    /// The engine serves READs encoded with the block codec when asked
    /// (older peers send 0: no).
    pub wire_codec: bool,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = if self.rdma { HELLO_RDMA } else { 0 }
            | if self.wire_codec { HELLO_WIRE_CODEC } else { 0 };
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        put_str(&mut b[12..12 + BOOT_ID_BYTES], &self.boot_id);
        put_str(&mut b[12 + BOOT_ID_BYTES..], &self.shm_socket);
        b
    }

    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<Self, TransferError> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let version = u16::from_le_bytes([b[4], b[5]]);
        if magic != MAGIC || version != VERSION {
            return Err(TransferError::InvalidArgument(BadInput::NotAPeer {
                magic,
                version,
            }));
        }
        Ok(Hello {
            pid: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            boot_id: get_str(&b[12..12 + BOOT_ID_BYTES]),
            shm_socket: get_str(&b[12 + BOOT_ID_BYTES..]),
            rdma: b[6] & HELLO_RDMA != 0,
            wire_codec: b[6] & HELLO_WIRE_CODEC != 0,
        })
    }

    /// Whether `other` runs on this host (equal, known kernel boot ids).
    pub fn same_host(&self, other: &Hello) -> bool {
        other.boot_id == self.boot_id && !other.boot_id.is_empty()
    }
}

fn put_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The kernel boot id: equal on two processes means the same host.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_garbage_is_refused() {
        let h = Hello {
            pid: 42,
            boot_id: "abc".into(),
            shm_socket: "kvfabric-1".into(),
            rdma: false,
            wire_codec: false,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let old = h.encode();
        assert_eq!(old[6], 0, "a hello without features sets no flag bit");
        let with_codec = Hello {
            wire_codec: true,
            ..h.clone()
        };
        let b = with_codec.encode();
        assert_eq!(Hello::decode(&b).unwrap(), with_codec);
        assert!(!Hello::decode(&b).unwrap().rdma);
        let with_nic = Hello {
            rdma: true,
            ..h.clone()
        };
        assert_eq!(Hello::decode(&with_nic.encode()).unwrap(), with_nic);
        assert!(Hello::decode(&[7u8; HELLO_BYTES]).is_err());
    }
}
