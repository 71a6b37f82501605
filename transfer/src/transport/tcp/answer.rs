//! What the tcp server answers, decided without I/O (the sans-IO split of
//! quinn-proto: protocol decisions here, sockets in `server.rs`): the check
//! of a request's ranges against the segment table, and the refusal frame a
//! failed check, an oversized notification or a bad endpoint turns into.

use std::sync::Arc;

use super::protocol::{Request, Response, Status, RESPONSE_BYTES};
use crate::core::Inner;
use crate::security::Capability;
use crate::segment::SegmentTable;
use crate::{SharedRegion, TransferError};

/// Longest reason a refusal carries.
const MAX_REASON_BYTES: usize = 4096;

/// A non-OK answer: its status, the aux word (the segment's length for
/// `OutOfBounds`) and the reason sent after the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: Status,
    pub aux: u64,
    pub reason: String,
}

impl Refusal {
    pub fn new(status: Status, aux: u64, reason: impl Into<String>) -> Self {
        Refusal {
            status,
            aux,
            reason: reason.into(),
        }
    }

    /// The response header and the (capped) reason bytes that follow it.
    pub fn frame(&self) -> ([u8; RESPONSE_BYTES], &[u8]) {
        let msg = &self.reason.as_bytes()[..self.reason.len().min(MAX_REASON_BYTES)];
        let head = Response {
            status: self.status,
            encoded: false,
            message_len: msg.len() as u32,
            checksum: self.aux,
            payload_len: 0,
        }
        .encode();
        (head, msg)
    }
}

/// Secured modes (`peer` is the connection's authenticated node id): a READ
/// must show a capability this engine issued to that peer, unexpired and
/// covering the whole op range. Mode `none` (`peer` None) checks nothing.
pub(crate) fn authorize(
    inner: &Inner,
    peer: Option<&str>,
    req: &Request,
    capability: Option<&[u8]>,
) -> Result<(), Refusal> {
    let Some(peer) = peer else {
        return Ok(());
    };
    let forbid = |why: &str| Refusal::new(Status::Forbidden, 0, why.to_string());
    let cap = capability
        .and_then(Capability::decode)
        .ok_or_else(|| forbid("a READ needs the holder's capability"))?;
    inner
        .caps
        .check(&cap, peer, req.segment, req.op_offset, req.op_len)
        .map_err(forbid)?;
    if !crate::core::lock(&inner.live_caps).contains(&cap.id) {
        return Err(forbid("capability revoked (its lease ended)"));
    }
    Ok(())
}

/// The region a request addresses, after checking the whole op range and
/// that the slice lies inside the op.
pub(crate) fn check(segments: &SegmentTable, req: &Request) -> Result<Arc<SharedRegion>, Refusal> {
    let region = segments
        .resolve("target", req.segment, req.op_offset, req.op_len)
        .map_err(|e| match e {
            TransferError::UnknownSegment { .. } => {
                Refusal::new(Status::UnknownSegment, 0, e.to_string())
            }
            TransferError::OutOfBounds { segment_len, .. } => {
                Refusal::new(Status::OutOfBounds, segment_len, e.to_string())
            }
            other => Refusal::new(Status::BadRequest, 0, other.to_string()),
        })?;
    let inside_op = req.slice_offset >= req.op_offset
        && req
            .slice_offset
            .checked_add(req.slice_len)
            .zip(req.op_offset.checked_add(req.op_len))
            .is_some_and(|(se, oe)| se <= oe);
    if !inside_op || req.slice_len == 0 {
        return Err(Refusal::new(Status::BadRequest, 0, "slice outside its op"));
    }
    Ok(region)
}

#[cfg(test)]
mod tests {
    use super::super::protocol::RequestKind;
    use super::*;

    fn read(segment: u64, op: (u64, u64), slice: (u64, u64)) -> Request {
        Request {
            kind: RequestKind::Read,
            flags: 0,
            width: 0,
            segment,
            op_offset: op.0,
            op_len: op.1,
            slice_offset: slice.0,
            slice_len: slice.1,
            checksum: 0,
        }
    }

    /// Every refusal is decided from the request and the table alone.
    #[test]
    fn checks_refuse_unknown_out_of_bounds_and_stray_slices() {
        let table = SegmentTable::default();
        let seg = table.register(Arc::new(SharedRegion::create("answer", 8192).unwrap()));
        assert!(check(&table, &read(seg.0, (0, 8192), (4096, 4096))).is_ok());
        let r = check(&table, &read(seg.0 + 1, (0, 10), (0, 10))).unwrap_err();
        assert_eq!(r.status, Status::UnknownSegment);
        let r = check(&table, &read(seg.0, (4096, 8192), (4096, 10))).unwrap_err();
        assert_eq!((r.status, r.aux), (Status::OutOfBounds, 8192));
        for slice in [(0, 4097), (4095, 10), (4096, 0), (u64::MAX, 2)] {
            let r = check(&table, &read(seg.0, (4096, 4096), slice)).unwrap_err();
            assert_eq!(r.status, Status::BadRequest, "slice {slice:?}");
        }
    }

    #[test]
    fn refusal_frames_carry_status_aux_and_a_capped_reason() {
        let r = Refusal::new(Status::OutOfBounds, 77, "x".repeat(5000));
        let (head, msg) = r.frame();
        let resp = Response::decode(&head).unwrap();
        assert_eq!((resp.status, resp.checksum), (Status::OutOfBounds, 77));
        assert_eq!(resp.message_len as usize, msg.len());
        assert_eq!(msg.len(), MAX_REASON_BYTES);
    }
}
