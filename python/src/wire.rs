//! One block over the node's gRPC CacheService, straight between the
//! messages and the caller's memory: a get copies each message into the
//! caller's segments as it arrives, hashing on the way; a put gathers the
//! segments into the messages, hashing on the way. Each byte is copied once
//! and hashed once.

use bytes::{Bytes, BytesMut};
use kvfabric_proto::v1::{GetRequest, PutHeader, PutRequest};
use kvfabric_transfer::checksum::Checksummer;
use kvfabric_types::{BlockKey, KvLayout};
use tonic::metadata::MetadataMap;
use tonic::{Extensions, Request};

use crate::conn::Conn;
use crate::error::PyClientError;
use crate::segments::Span;

/// Bytes of one put message (the node's own stream chunk).
const CHUNK: usize = 1 << 20;

/// What one get of a block came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    /// The block is in the caller's segments, its checksum verified.
    Loaded,
    /// No node holds it.
    Missing,
    /// It arrived with another size than the segments', or failed its
    /// checksum: the segments hold nothing usable.
    Unusable(&'static str),
}

/// Writes a stream of chunks into consecutive spans.
struct SpanWriter<'a> {
    spans: &'a [Span],
    at: usize,
    off: usize,
    hash: Checksummer,
}

impl SpanWriter<'_> {
    /// Copy `data` on; false if it runs past the last span.
    fn write(&mut self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let Some(span) = self.spans.get(self.at) else {
                return false;
            };
            // SAFETY: the batch is the only user of its spans while it runs.
            let dst = unsafe { span.as_mut() };
            let n = (dst.len() - self.off).min(data.len());
            self.hash
                .copy_and_update(&mut dst[self.off..self.off + n], &data[..n]);
            data = &data[n..];
            self.off += n;
            if self.off == dst.len() {
                self.at += 1;
                self.off = 0;
            }
        }
        true
    }
}

/// Read block `key` into `spans` through the node of `conn`.
pub(crate) async fn get_into(
    conn: &Conn,
    key: &BlockKey,
    spans: &[Span],
) -> Result<Got, PyClientError> {
    let want: usize = spans.iter().map(Span::len).sum();
    let msg = GetRequest {
        key: key.as_bytes().to_vec(),
        offset: 0,
        length: 0,
    };
    let req = Request::from_parts(conn.metadata(None), Extensions::default(), msg);
    let status = |s: tonic::Status| conn.error("get", &s);
    let mut stream = match conn.client.clone().get(req).await {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(Got::Missing),
        Err(s) => return Err(status(s)),
    };
    let Some(first) = stream.message().await.map_err(status)? else {
        return Ok(Got::Unusable("an empty answer"));
    };
    let Some(header) = first.header else {
        return Ok(Got::Unusable("no header"));
    };
    if header.size as usize != want {
        return Ok(Got::Unusable("another size than the buffers'"));
    }
    let mut w = SpanWriter {
        spans,
        at: 0,
        off: 0,
        hash: Checksummer::new(),
    };
    let mut received = first.data.len();
    if !w.write(&first.data) {
        return Ok(Got::Unusable("more bytes than its size"));
    }
    while let Some(m) = stream.message().await.map_err(status)? {
        received += m.data.len();
        if !w.write(&m.data) {
            return Ok(Got::Unusable("more bytes than its size"));
        }
    }
    if received != want {
        return Ok(Got::Unusable("fewer bytes than its size"));
    }
    if w.hash.digest() != header.checksum {
        return Ok(Got::Unusable("bytes that fail its checksum"));
    }
    Ok(Got::Loaded)
}

/// Store block `key` of `layout` from `spans` through the node of `conn`;
/// true when it was stored, false when the node had it already.
pub(crate) async fn put_from(
    conn: &Conn,
    key: &BlockKey,
    layout: &KvLayout,
    spans: &[Span],
    owner: Option<&str>,
) -> Result<bool, PyClientError> {
    let (chunks, checksum) = gather(spans);
    let size = chunks.iter().map(Bytes::len).sum::<usize>() as u64;
    let header = PutHeader {
        key: key.as_bytes().to_vec(),
        layout: Some(layout.into()),
        size,
        checksum: Some(checksum),
        durable: false,
        tokens: 0,
    };
    let mut msgs = Vec::with_capacity(chunks.len().max(1));
    let mut chunks = chunks.into_iter();
    msgs.push(PutRequest {
        header: Some(header),
        data: chunks.next().unwrap_or_default(),
    });
    msgs.extend(chunks.map(|data| PutRequest { header: None, data }));
    let meta: MetadataMap = conn.metadata(owner);
    let req = Request::from_parts(meta, Extensions::default(), futures::stream::iter(msgs));
    match conn.client.clone().put(req).await {
        Ok(r) => Ok(!r.into_inner().already_present),
        Err(s) => Err(conn.error("put", &s)),
    }
}

/// The spans' bytes cut into stream chunks, and their checksum.
fn gather(spans: &[Span]) -> (Vec<Bytes>, u64) {
    let total: usize = spans.iter().map(Span::len).sum();
    let mut hash = Checksummer::new();
    let mut out = Vec::with_capacity(total.div_ceil(CHUNK));
    let mut cur = BytesMut::with_capacity(CHUNK.min(total));
    for span in spans {
        // SAFETY: the caller does not change a block while it is being put.
        let mut src = unsafe { span.as_ref() };
        while !src.is_empty() {
            let n = (CHUNK - cur.len()).min(src.len());
            hash.update(&src[..n]);
            cur.extend_from_slice(&src[..n]);
            src = &src[n..];
            if cur.len() == CHUNK {
                out.push(std::mem::replace(&mut cur, BytesMut::with_capacity(CHUNK)).freeze());
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur.freeze());
    }
    (out, hash.digest())
}
