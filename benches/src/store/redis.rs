//! The Redis peer of the store bench: a redis-server started on a loopback
//! port with persistence off, driven over raw RESP by `clients` connections
//! (SET then GET of every block), measured in the same run as kvfabric.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::shared::{gbps, key, parallel, parking, pct_ms, BLOCK};

struct RedisServer(Child);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn resp(conn: &mut BufReader<TcpStream>, args: &[&[u8]]) -> anyhow::Result<Option<Vec<u8>>> {
    let s = conn.get_mut();
    let mut head = format!("*{}\r\n", args.len()).into_bytes();
    for (n, a) in args.iter().enumerate() {
        head.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        if n + 1 < args.len() || a.len() < 4096 {
            head.extend_from_slice(a);
            head.extend_from_slice(b"\r\n");
        } else {
            s.write_all(&head)?;
            s.write_all(a)?;
            head = b"\r\n".to_vec();
        }
    }
    s.write_all(&head)?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    match line.as_bytes().first() {
        Some(b'+') => Ok(None),
        Some(b'$') => {
            let len: i64 = line[1..].trim().parse()?;
            if len < 0 {
                return Ok(None);
            }
            let mut v = vec![0u8; len as usize + 2];
            conn.read_exact(&mut v)?;
            v.truncate(len as usize);
            Ok(Some(v))
        }
        _ => bail!("redis: {}", line.trim()),
    }
}

pub(super) fn redis(
    sources: &[Vec<u8>],
    clients: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let port = kvfabric_testbed::ports::free_loopback_port()?;
    let _server = RedisServer(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting redis-server")?,
    );
    let connect = || -> anyhow::Result<BufReader<TcpStream>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(BufReader::with_capacity(1 << 20, s));
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    resp(&mut connect()?, &[b"PING"])?;
    let conns: Vec<_> = (0..clients)
        .map(|_| connect().map(parking))
        .collect::<Result<_, _>>()?;
    let n = sources.len();
    let t = Instant::now();
    parallel(clients, n, |i| {
        let mut c = conns[i % clients]
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        resp(&mut c, &[b"SET", &key(i).0, &sources[i]])?;
        Ok(())
    })?;
    let set = gbps(n * BLOCK, t.elapsed());
    let t = Instant::now();
    let mut lat = parallel(clients, n, |i| {
        let mut c = conns[i % clients]
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let v = resp(&mut c, &[b"GET", &key(i).0])?.context("redis miss")?;
        if v.len() != BLOCK {
            bail!("redis returned {} bytes", v.len());
        }
        Ok(())
    })?;
    let get = gbps(n * BLOCK, t.elapsed());
    out.insert("redis_set_gbps".into(), json!(set));
    out.insert("redis_get_gbps".into(), json!(get));
    out.insert("redis_get_p50_ms".into(), json!(pct_ms(&mut lat, 0.5)));
    out.insert("redis_get_p99_ms".into(), json!(pct_ms(&mut lat, 0.99)));
    Ok(())
}
