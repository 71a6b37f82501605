//! The shm control socket's message kinds and status bytes. A request is a
//! kind byte and a little-endian u32 count, then its body: CHECK (`count`
//! ranges of segment, offset, len as u64s; one status byte and u64 aux word
//! each back), MAP (one segment id; status, length, and the memfd passed with
//! the reply), NOTIFY (`count` payload bytes; one status byte back).

pub(super) const KIND_CHECK: u8 = 1;
pub(super) const KIND_MAP: u8 = 2;
pub(super) const KIND_NOTIFY: u8 = 3;
pub(super) const ST_OK: u8 = 0;
pub(super) const ST_UNKNOWN: u8 = 1;
pub(super) const ST_OOB: u8 = 2;

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
