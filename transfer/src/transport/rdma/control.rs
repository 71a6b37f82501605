//! The range round trip of an rdma batch, on a link's tcp control
//! connection ([`RequestKind::RdmaRange`], pipelined): the owner refuses bad
//! ranges before a byte moves and answers each segment's rkey, and the
//! checksum of the range when asked (before a checksummed READ, and after a
//! checksummed WRITE landed).

use crate::transport::tcp::conn::Conn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::core::{Inner, PreparedOp};
use crate::error::ConnectionFault;
use crate::segment::RdmaKey;
use crate::transport::io::{bounded, read_message};
use crate::transport::tcp::client;
use crate::transport::tcp::protocol::{
    Request, RequestKind, Response, Status, FLAG_CHECKSUM, RDMA_KEY_BYTES, REQUEST_BYTES,
    RESPONSE_BYTES,
};
use crate::TransferError;

/// The owner's answer to a range check: the segment's key (None: not
/// registered with its NIC) and the range's checksum when asked.
pub(super) struct RangeReply {
    pub key: Option<RdmaKey>,
    pub checksum: u64,
}

/// Range-check `ops[i]` for every `(i, with_checksum)` in `asks`, pipelined on
/// one control connection. `Err` means the connection broke.
pub(super) async fn ranges(
    inner: &Inner,
    peer: &str,
    conn: &mut Conn,
    ops: &[PreparedOp],
    asks: &[(usize, bool)],
) -> Result<Vec<Result<RangeReply, TransferError>>, TransferError> {
    let timeout = inner.config.op_timeout();
    let mut out = Vec::with_capacity(asks.len() * REQUEST_BYTES);
    for &(i, sum) in asks {
        let op = &ops[i].op;
        let req = Request {
            kind: RequestKind::RdmaRange,
            flags: if sum { FLAG_CHECKSUM } else { 0 },
            width: 0,
            segment: op.remote.0,
            op_offset: op.remote_offset,
            op_len: op.len,
            slice_offset: op.remote_offset,
            slice_len: op.len,
            checksum: 0,
        };
        out.extend_from_slice(&req.encode());
    }
    let (mut rd, mut wr) = conn.split();
    let writer = bounded(peer, timeout, wr.write_all(&out));
    let reader = async {
        let mut replies = Vec::with_capacity(asks.len());
        for &(i, _) in asks {
            let mut head = [0u8; RESPONSE_BYTES];
            bounded(peer, timeout, rd.read_exact(&mut head)).await?;
            let resp = Response::decode(&head)?;
            replies.push(match resp.status {
                Status::Ok if resp.payload_len == RDMA_KEY_BYTES as u64 => {
                    let mut key = [0u8; RDMA_KEY_BYTES];
                    bounded(peer, timeout, rd.read_exact(&mut key)).await?;
                    Ok(RangeReply {
                        key: Some(RdmaKey::decode(&key)?),
                        checksum: resp.checksum,
                    })
                }
                Status::Ok => {
                    let len = resp.payload_len;
                    return Err(TransferError::connection(
                        peer,
                        ConnectionFault::RdmaKeyLen { len },
                    ));
                }
                status => {
                    let reason =
                        bounded(peer, timeout, read_message(&mut rd, resp.message_len)).await?;
                    if status == Status::Unsupported {
                        Ok(RangeReply {
                            key: None,
                            checksum: 0,
                        })
                    } else {
                        let op = &ops[i].op;
                        Err(client::refusal(peer, &resp, reason, op, 0, op.len))
                    }
                }
            });
        }
        Ok(replies)
    };
    let ((), replies) = tokio::try_join!(writer, reader)?;
    Ok(replies)
}
