//! The TCP connections a process holds, for the question an fd count
//! cannot answer: which sockets grew, to whom, in which state.
//!
//! `/proc/<pid>/net/tcp` lists every IPv4 TCP socket of the process's
//! network namespace (so it works for a process inside a test bed host);
//! the ones this process holds are those whose inode is one of its
//! `/proc/<pid>/fd` links (`socket:[inode]`).

use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

/// One TCP socket of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    /// `ESTABLISHED`, `LISTEN`, `CLOSE_WAIT`, ...
    pub state: &'static str,
}

/// The IPv4 TCP sockets `pid` holds (empty when it is gone).
pub fn tcp_sockets(pid: u32) -> Vec<TcpSocket> {
    let inodes = socket_inodes(pid);
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return Vec::new();
    };
    parse_tcp_table(&table)
        .into_iter()
        .filter(|(inode, _)| inodes.contains(inode))
        .map(|(_, s)| s)
        .collect()
}

/// The process's sockets summed by what they are: `listen`, or
/// `<state> <local port or "*"> -> <remote ip>:<remote port or "*">`, the
/// ephemeral side written `*` (so a pool's connections to one peer count
/// under one key, on both ends).
pub fn tcp_summary(pid: u32) -> BTreeMap<String, u64> {
    let sockets = tcp_sockets(pid);
    let listening: HashSet<u16> = sockets
        .iter()
        .filter(|s| s.state == "LISTEN")
        .map(|s| s.local.port())
        .collect();
    let mut out = BTreeMap::new();
    for s in &sockets {
        let key = if s.state == "LISTEN" {
            "listen".to_string()
        } else if listening.contains(&s.local.port()) {
            format!("{} :{} <- {}", s.state, s.local.port(), s.remote.ip())
        } else {
            format!("{} -> {}", s.state, s.remote)
        };
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let t = std::fs::read_link(e.path()).ok()?;
            let t = t.to_string_lossy();
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// (inode, socket) of every row of a `/proc/net/tcp` table.
fn parse_tcp_table(table: &str) -> Vec<(u64, TcpSocket)> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state) = (addr(f.get(1)?)?, addr(f.get(2)?)?, f.get(3)?);
            let inode = f.get(9)?.parse().ok()?;
            let state = state_name(u8::from_str_radix(state, 16).ok()?);
            Some((
                inode,
                TcpSocket {
                    local,
                    remote,
                    state,
                },
            ))
        })
        .collect()
}

/// `0300CB0A:1B58`: the address as a little-endian u32 in hex, the port in hex.
fn addr(s: &str) -> Option<SocketAddrV4> {
    let (ip, port) = s.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    Some(SocketAddrV4::new(Ipv4Addr::from(ip.swap_bytes()), port))
}

fn state_name(st: u8) -> &'static str {
    match st {
        0x01 => "ESTABLISHED",
        0x02 => "SYN_SENT",
        0x03 => "SYN_RECV",
        0x04 => "FIN_WAIT1",
        0x05 => "FIN_WAIT2",
        0x06 => "TIME_WAIT",
        0x07 => "CLOSE",
        0x08 => "CLOSE_WAIT",
        0x09 => "LAST_ACK",
        0x0A => "LISTEN",
        0x0B => "CLOSING",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_net_tcp_table_is_parsed() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0300CB0A:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n\
   1: 0300CB0A:83EC 0400CB0A:1B58 08 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        let rows = parse_tcp_table(table);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, 4242);
        assert_eq!(rows[0].1.local, "10.203.0.3:7000".parse().unwrap());
        assert_eq!(rows[0].1.state, "LISTEN");
        assert_eq!(rows[1].1.remote, "10.203.0.4:7000".parse().unwrap());
        assert_eq!(rows[1].1.state, "CLOSE_WAIT");
    }

    #[test]
    fn this_process_holds_the_listener_and_both_ends_of_a_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (_s, _) = l.accept().expect("accept");
        let mine: Vec<TcpSocket> = tcp_sockets(std::process::id())
            .into_iter()
            .filter(|s| s.local.port() == port || s.remote.port() == port)
            .collect();
        assert_eq!(mine.len(), 3, "{mine:?}");
        let summary = tcp_summary(std::process::id());
        assert!(
            summary.get(&format!("ESTABLISHED :{port} <- 127.0.0.1")) >= Some(&1),
            "{summary:?}"
        );
    }
}
