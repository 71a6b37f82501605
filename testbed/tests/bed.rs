//! The test bed itself: hosts reach each other over the bridge and nothing
//! else, a link taken down partitions its host, shaping installs tbf on
//! both ends, and dropping the bed removes every namespace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use kvfabric_testbed::Testbed;

fn bed(hosts: usize, gbit: Option<f64>) -> Option<Testbed> {
    Testbed::up_or_skip(hosts, gbit)
}

fn namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn try_connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500))
}

#[test]
fn hosts_talk_over_the_bridge_and_a_downed_link_partitions() {
    let Some(bed) = bed(2, Some(1.0)) else { return };
    let (h0, h1) = (bed.host(0).clone(), bed.host(1).clone());
    let addr = SocketAddr::from((h1.ip(), 7000));
    let server = h1.spawn(move || {
        let l = TcpListener::bind(addr).expect("bind on h1's address");
        for _ in 0..2 {
            if let Ok((mut s, _)) = l.accept() {
                let _ = s.write_all(b"hi");
            }
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let got = h0
        .spawn(move || {
            let mut s = try_connect(addr).expect("h0 reaches h1");
            let mut b = [0u8; 2];
            s.read_exact(&mut b).expect("read");
            b
        })
        .join()
        .expect("client thread")
        .expect("entered h0");
    assert_eq!(&got, b"hi");
    // This thread is in the caller's namespace: the address does not exist here.
    assert!(
        TcpListener::bind(SocketAddr::from((h1.ip(), 0))).is_err(),
        "a test bed address exists outside the bed"
    );

    h1.link_down().expect("link down");
    let cut = h0
        .spawn(move || try_connect(addr).is_err())
        .join()
        .expect("thread")
        .expect("entered");
    assert!(cut, "h1 reachable with its link down");
    h1.link_up().expect("link up");
    let back = h0
        .spawn(move || {
            // The bridge port needs a moment to forward again.
            (0..40).any(|_| {
                let ok = try_connect(addr).is_ok();
                if !ok {
                    std::thread::sleep(Duration::from_millis(100));
                }
                ok
            })
        })
        .join()
        .expect("thread")
        .expect("entered");
    assert!(back, "h1 unreachable after its link came back");
    server.join().expect("server thread").expect("entered h1");

    let qdisc = h0
        .command("tc")
        .args(["qdisc", "show", "dev", "eth0"])
        .output()
        .expect("tc");
    let text = String::from_utf8_lossy(&qdisc.stdout);
    assert!(text.contains("tbf") && text.contains("1Gbit"), "{text}");
    h0.shape(None).expect("unshape");

    let name = bed.name().to_string();
    assert_eq!(
        namespaces().iter().filter(|n| n.starts_with(&name)).count(),
        3
    );
    drop(bed);
    assert!(
        !namespaces().iter().any(|n| n.starts_with(&name)),
        "namespaces left behind"
    );
}

#[test]
fn a_runtime_of_a_host_opens_its_sockets_inside_it() {
    let Some(bed) = bed(1, None) else { return };
    let ip = bed.host(0).ip();
    let rt = bed.host(0).runtime(1).expect("runtime");
    let bound =
        rt.block_on(rt.spawn(async move { tokio::net::TcpListener::bind((ip, 0)).await.is_ok() }));
    assert!(
        bound.expect("task"),
        "the host's address is not bound inside its runtime"
    );
    // The blocking pool is inside too.
    let bound = rt.block_on(rt.spawn_blocking(move || TcpListener::bind((ip, 0)).is_ok()));
    assert!(bound.expect("task"));
}

#[test]
fn stale_namespaces_of_a_dead_process_are_removed() {
    if bed(1, None).is_none() {
        return;
    }
    // A pid that cannot exist (above pid_max).
    let stale = format!("{}4194999-0-h0", kvfabric_testbed::NAME_PREFIX);
    let ok = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .expect("ip");
    assert!(ok.success());
    let bed = bed(1, None).expect("second bed");
    assert!(!namespaces().contains(&stale), "stale namespace kept");
    drop(bed);
}
