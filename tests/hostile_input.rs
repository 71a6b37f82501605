//! Hostile input against every listener of real `kvfabric node` processes
//! (what must hold: "every listener keeps serving after the hostile-input
//! suite, and nothing already stored is lost"): two nodes on real etcd store
//! blocks; then each node's gRPC port (CacheService, DirectoryService,
//! HolderService), transfer tcp port and HTTP port (metrics, health,
//! console) gets garbage: random bytes from a seeded RNG, truncated frames,
//! huge length prefixes, oversized gRPC messages, invalid protobuf on every
//! method, and half-open connections that stay open while the checks run.
//! Afterwards every listener must still answer and every stored block must
//! read back bit-identical, across nodes (which goes through the transfer
//! port) too.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use kvfabric_node::cluster::client;
use kvfabric_testkit::procs::node::*;
use kvfabric_testkit::EtcdProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Cases of random bytes per listener.
const RANDOM_CASES: usize = 64;
/// Half-open connections held per listener while the checks run.
const HALF_OPEN: usize = 16;
/// How long one case may take (connect, write, read to EOF).
const CASE_TIME: Duration = Duration::from_secs(3);

/// xorshift64*: the cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = 1 + (self.next() as usize) % max;
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Listener {
    Grpc,
    Transfer,
    Http,
}

/// Send `bytes` on a new connection to `addr`, close the write side and
/// read whatever comes back until EOF (bounded): the server must neither
/// crash nor keep the connection forever.
async fn send(addr: String, bytes: Vec<u8>) {
    let run = async {
        let mut s = TcpStream::connect(&addr).await.ok()?;
        let _ = s.write_all(&bytes).await;
        let _ = s.shutdown().await;
        let mut sink = vec![0u8; 64 * 1024];
        while s.read(&mut sink).await.ok()? > 0 {}
        Some(())
    };
    let _ = tokio::time::timeout(CASE_TIME, run).await;
}

/// A transfer hello (`kvfabric_transfer::hello`: "KVFT", version 1, flags,
/// pid, boot id, socket name).
fn hello(magic: u32) -> Vec<u8> {
    let mut b = vec![0u8; 124];
    b[0..4].copy_from_slice(&magic.to_le_bytes());
    b[4..6].copy_from_slice(&1u16.to_le_bytes());
    b[8..12].copy_from_slice(&4242u32.to_le_bytes());
    b[12..20].copy_from_slice(b"not-this");
    b
}

/// A transfer request header (`transport::tcp::protocol::Request`).
fn request(kind: u8, flags: u8, words: [u64; 6]) -> Vec<u8> {
    let mut b = vec![0u8; 56];
    b[0] = kind;
    b[1] = flags;
    for (i, w) in words.iter().enumerate() {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// The protocol-shaped cases of one listener: truncated frames, huge
/// length prefixes, bad magic.
fn shaped(kind: Listener) -> Vec<Vec<u8>> {
    const H2: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let cat = |parts: &[&[u8]]| parts.concat();
    match kind {
        Listener::Grpc => vec![
            H2[..10].to_vec(),
            H2.to_vec(),
            // A frame header claiming 16 MiB - 1 of DATA.
            cat(&[H2, &[0xff, 0xff, 0xff, 0x0, 0x0, 0x0, 0x0, 0x0, 0x1]]),
            // SETTINGS of a length that is not a multiple of 6, truncated.
            cat(&[H2, &[0x0, 0x0, 0x7, 0x4, 0x0, 0x0, 0x0, 0x0, 0x0, 0x1]]),
            // HEADERS with garbage HPACK.
            cat(&[
                H2,
                &[
                    0x0, 0x0, 0x4, 0x1, 0x5, 0x0, 0x0, 0x0, 0x1, 0xff, 0xff, 0xff, 0xff,
                ],
            ]),
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ],
        Listener::Http => {
            vec![
            b"GET /metr".to_vec(),
            b"GET /health HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n".to_vec(),
            b"POST /api/v1/capacity HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nabc"
                .to_vec(),
            b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab"
                .to_vec(),
            cat(&[b"GET / HTTP/1.1\r\nX-Big: ", &vec![b'a'; 1 << 20], b"\r\n\r\n"]),
            cat(&[b"GET /", &vec![b'%'; 64 * 1024], b" HTTP/1.1\r\n\r\n"]),
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
        ]
        }
        Listener::Transfer => {
            let ok = hello(0x5446_564b);
            let huge = u64::MAX;
            vec![
                ok[..60].to_vec(),
                hello(0xdead_beef),
                cat(&[&ok, &request(1, 0, [0, 0, huge, 0, huge, 0])]),
                cat(&[&ok, &request(2, 0, [0, 0, huge, 0, huge, 0]), b"xyz"]),
                cat(&[
                    &ok,
                    &request(2, 1, [7, 1 << 40, 1 << 40, 1 << 40, 1 << 30, 0]),
                ]),
                cat(&[&ok, &request(3, 0, [0, 0, huge, 0, huge, 0]), b"n"]),
                cat(&[&ok, &request(4, 0, [0, 0, huge, 0, huge, 0])]),
                cat(&[&ok, &request(5, 0, [0, 0, huge, 0, huge, 0])]),
                cat(&[&ok, &request(99, 0, [0; 6])]),
                cat(&[&ok, &request(1, 2, [0, 0, 64, 0, 64, 0]), &[1, 2, 3]]),
                cat(&[&ok, &request(1, 0, [0, 0, 64, 0, 64, 0])[..20]]),
            ]
        }
    }
}

/// Every case against one listener at once; returns how many ran.
async fn attack(addr: &str, kind: Listener, rng: &mut Rng) -> usize {
    let mut cases = shaped(kind);
    for _ in 0..RANDOM_CASES {
        let mut b = rng.bytes(8192);
        // Half of them start right (a valid preface or hello) and go wrong after.
        if rng.next() % 2 == 0 {
            let head: Vec<u8> = match kind {
                Listener::Grpc => b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
                Listener::Http => b"GET /metrics HTTP/1.1\r\n".to_vec(),
                Listener::Transfer => hello(0x5446_564b),
            };
            b = [head, b].concat();
        }
        cases.push(b);
    }
    let n = cases.len();
    let mut set = tokio::task::JoinSet::new();
    for c in cases {
        set.spawn(send(addr.to_string(), c));
    }
    while set.join_next().await.is_some() {}
    n
}

/// Connections that send the start of a frame and then nothing (slow
/// loris); kept open by the caller.
async fn half_open(addr: &str, kind: Listener) -> Vec<TcpStream> {
    let start: &[u8] = match kind {
        Listener::Grpc => b"PRI * HTTP/2.0\r\n",
        Listener::Http => b"GET /metrics HTTP/1.1\r\nHost:",
        Listener::Transfer => b"KVFT",
    };
    let mut held = Vec::new();
    for _ in 0..HALF_OPEN {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            let _ = s.write_all(start).await;
            held.push(s);
        }
    }
    held
}

/// Raw bytes as a gRPC message: invalid protobuf through a real HTTP/2
/// client.
#[derive(Clone, Copy, Default)]
struct Raw;
struct RawCoder;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCoder;
    type Decoder = RawCoder;
    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }
    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

impl Encoder for RawCoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut v = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

const METHODS: &[&str] = &[
    "/kvfabric.v1.CacheService/Lookup",
    "/kvfabric.v1.CacheService/Exists",
    "/kvfabric.v1.CacheService/Get",
    "/kvfabric.v1.CacheService/Remove",
    "/kvfabric.v1.CacheService/Pin",
    "/kvfabric.v1.CacheService/Unpin",
    "/kvfabric.v1.CacheService/Stats",
    "/kvfabric.v1.CacheService/ClusterStatus",
    "/kvfabric.v1.CacheService/Capacity",
    "/kvfabric.v1.CacheService/NoSuchMethod",
    "/kvfabric.internal.v1.DirectoryService/Announce",
    "/kvfabric.internal.v1.DirectoryService/Withdraw",
    "/kvfabric.internal.v1.DirectoryService/Locate",
    "/kvfabric.internal.v1.DirectoryService/ReportStale",
    "/kvfabric.internal.v1.HolderService/Lease",
    "/kvfabric.internal.v1.HolderService/Release",
    "/kvfabric.internal.v1.HolderService/LeaseMany",
    "/kvfabric.internal.v1.HolderService/ReleaseMany",
];

/// Invalid protobuf on every method (unary, and as the Put stream), and
/// messages over the size limit; every call must fail or answer, and the
/// channel must stay usable. Returns how many calls were made.
async fn grpc_abuse(addr: &str, rng: &mut Rng) -> usize {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .timeout(CASE_TIME)
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let mut calls = 0;
    let mut bodies: Vec<Vec<u8>> = (0..6).map(|_| rng.bytes(512)).collect();
    // A field header claiming a 2^62-byte length-delimited field.
    bodies.push(vec![
        0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f,
    ]);
    // Over the node's message limit (and tonic's 4 MiB default).
    bodies.push(vec![0x0a; 80 << 20]);
    for path in METHODS {
        for body in &bodies {
            grpc.ready().await.expect("channel ready");
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
            let _ = grpc
                .unary::<Vec<u8>, Vec<u8>, Raw>(tonic::Request::new(body.clone()), path, Raw)
                .await;
            calls += 1;
        }
    }
    for body in &bodies {
        grpc.ready().await.expect("channel ready");
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/kvfabric.v1.CacheService/Put");
        let stream = futures::stream::iter(vec![body.clone(), body.clone()]);
        let _ = grpc
            .client_streaming::<_, Vec<u8>, Vec<u8>, Raw>(tonic::Request::new(stream), path, Raw)
            .await;
        calls += 1;
    }
    calls
}

/// GET `path` on `addr`: the status line.
async fn http_get(addr: &str, path: &str) -> String {
    let run = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        Some(String::from_utf8_lossy(&out).lines().next()?.to_string())
    };
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_keeps_serving_and_nothing_stored_is_lost() {
    let dir = tempfile::tempdir().expect("dir");
    let etcd = EtcdProcess::start().expect("etcd");
    let flags = vec![
        "--etcd".to_string(),
        etcd.endpoint(),
        "--etcd-prefix".into(),
        "/hostile".into(),
    ];
    let a = NodeProc::start("a", dir.path(), &flags, true);
    let b = NodeProc::start("b", dir.path(), &flags, false);
    let mut ca = a.client().await;
    wait_members(&a, &["a", "b"], Duration::from_secs(20)).await;
    wait_members(&b, &["a", "b"], Duration::from_secs(20)).await;
    let stored = keys(21, 24);
    put_all(&mut ca, &stored, false).await;
    let durable = keys(22, 8);
    put_all(&mut ca, &durable, true).await;

    let started = Instant::now();
    let mut rng = Rng(0x5eed_2026_1126);
    let mut held = Vec::new();
    let mut cases = 0;
    for node in [&a, &b] {
        for (kind, addr) in [
            (Listener::Grpc, &node.grpc),
            (Listener::Transfer, &node.transfer),
            (Listener::Http, &node.http),
        ] {
            held.extend(half_open(addr, kind).await);
            cases += attack(addr, kind, &mut rng).await;
        }
        cases += grpc_abuse(&node.grpc, &mut rng).await;
    }
    eprintln!(
        "hostile input: {cases} cases, {} half-open connections held, {:?}",
        held.len(),
        started.elapsed()
    );

    // Every listener still answers, with the half-open connections open.
    for node in [&a, &b] {
        for path in ["/health", "/metrics", "/api/v1/capacity"] {
            let status = http_get(&node.http, path).await;
            assert!(
                status.starts_with("HTTP/1.1 200"),
                "{} {path}: {status:?}\n{}",
                node.id,
                node.log()
            );
        }
        let mut c = client::connect(&node.grpc, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("{} gRPC: {e}\n{}", node.id, node.log()));
        c.stats(kvfabric_proto::v1::StatsRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{} Stats: {e}\n{}", node.id, node.log()));
    }
    // Nothing stored is lost: read back on a, and from b (over a's transfer
    // port: b holds none of them).
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    let all: Vec<_> = stored.iter().chain(&durable).copied().collect();
    read_all_exact(&mut ca, &all, &[&a, &b]).await;
    let served = read_all_exact(&mut cb, &all, &[&a, &b]).await;
    assert!(served.iter().any(|n| n == "a"), "served by {served:?}");
    // And a new block still goes in and across.
    let fresh = keys(23, 4);
    put_all(&mut ca, &fresh, false).await;
    read_all_exact(&mut cb, &fresh, &[&a, &b]).await;
    drop(held);
}
