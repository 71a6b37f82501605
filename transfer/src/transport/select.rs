//! Transport selection, in one place: per peer, which transport carries its
//! batches, the links of every transport to it, and the dispatch of a batch to
//! the transport chosen (ops rdma cannot carry go over tcp).
//!
//! A peer's transport is decided after a hello: under `auto`, shm on the same
//! host, then rdma where both ends have a device, else tcp (an explicit `shm`
//! or `rdma` choice that cannot be met is an error instead). It stands while
//! its links work; a broken shm or rdma link drops that transport's pool, and
//! the next batch decides again (after a fresh hello). No lock here is held
//! across an await.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;

use super::contract::{BatchTransport, Transport};
use super::idle::IdleLimits;
use super::rdma::{Nic, RdmaPeer};
use super::shm::{self, ShmPeer};
use super::tcp::{self, client, CodecSpeeds, TcpPeer};
use crate::config::TransportChoice;
use crate::core::{lock, BatchResults, Inner, OpResult, PreparedOp};
use crate::error::Missing;
use crate::TransferError;

/// The listening ends of every transport, bound before the engine's hello
/// exists (the shm socket's name comes from the tcp port).
pub(crate) struct Listeners {
    tcp: TcpListener,
    shm: UnixListener,
    pub local_addr: SocketAddr,
    pub shm_socket: String,
    pub nic: Nic,
}

impl Listeners {
    /// Bind the tcp listener and the shm socket, and look for an RDMA NIC.
    pub async fn bind(listen: &str) -> Result<Self, TransferError> {
        let tcp = TcpListener::bind(listen)
            .await
            .map_err(|e| TransferError::io("tcp bind", e))?;
        let local_addr = tcp
            .local_addr()
            .map_err(|e| TransferError::io("tcp local_addr", e))?;
        let shm_socket = shm::socket_name(std::process::id(), local_addr.port());
        let shm = shm::bind(&shm_socket)?;
        Ok(Listeners {
            tcp,
            shm,
            local_addr,
            shm_socket,
            nic: Nic::discover(),
        })
    }
}

/// Every transport of one engine: the NIC, the links to each peer, and the
/// servers answering peers.
pub(crate) struct Transports {
    inner: Arc<Inner>,
    nic: Arc<Nic>,
    peers: Peers,
    /// The accept loops and the idle sweeper ([`sweep_idle`]), aborted on
    /// drop.
    servers: Vec<JoinHandle<()>>,
    /// The block codec's speeds on this machine, which every peer's
    /// wire-compression choice weighs (tcp).
    speeds: Arc<CodecSpeeds>,
}

/// Every peer's links, shared with the idle sweeper.
type Peers = Arc<Mutex<HashMap<String, Arc<PeerLinks>>>>;

/// How often the idle links of every peer are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Transports {
    /// Serve peers on `listeners` until dropped.
    pub fn serve(inner: Arc<Inner>, listeners: Listeners) -> Self {
        let nic = Arc::new(listeners.nic);
        let peers = Peers::default();
        let servers = vec![
            tokio::spawn(tcp::accept_loop(listeners.tcp, inner.clone(), nic.clone())),
            tokio::spawn(shm::accept_loop(listeners.shm, inner.clone())),
            tokio::spawn(sweep_idle(peers.clone(), IdleLimits::of(&inner.config))),
        ];
        Transports {
            inner,
            nic,
            peers,
            servers,
            speeds: Arc::default(),
        }
    }

    /// The engine's NIC (segments register with it).
    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// The transport chosen for `peer`, while its links work.
    pub fn chosen(&self, peer: &str) -> Option<Transport> {
        let links = lock(&self.peers).get(peer).cloned();
        links.and_then(|l| l.chosen())
    }

    /// Run prepared ops against `peer` over its transport; one result per op.
    pub async fn run(&self, peer: &str, ops: Vec<PreparedOp>) -> Vec<OpResult> {
        let links = self.peer(peer);
        let t = match links.choose(&self.inner, peer).await {
            Ok(t) => t,
            Err(e) => return vec![Err(e); ops.len()],
        };
        match t {
            Transport::Tcp => self.carry(&links.tcp, &links, peer, ops).await,
            Transport::Shm => self.carry(&links.shm, &links, peer, ops).await,
            Transport::Rdma => self.carry(&links.rdma, &links, peer, ops).await,
        }
    }

    /// Deliver a notification; rdma carries data only, so its notifications
    /// ride its control plane, tcp.
    pub async fn notify(&self, peer: &str, note: &[u8]) -> Result<(), TransferError> {
        let links = self.peer(peer);
        match links.choose(&self.inner, peer).await? {
            Transport::Shm => links.shm.notify(&self.inner, peer, note).await,
            Transport::Tcp | Transport::Rdma => links.tcp.notify(&self.inner, peer, note).await,
        }
    }

    /// Run `ops` over `transport`; the ops it hands back go over tcp.
    async fn carry<T: BatchTransport>(
        &self,
        transport: &T,
        links: &PeerLinks,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<OpResult> {
        let kept = T::HANDS_BACK.then(|| ops.clone());
        let slots = transport.run_batch(&self.inner, peer, ops).await;
        let mut results = BatchResults::from_slots(slots);
        if let Some(kept) = kept {
            let index = results.unsettled();
            if !index.is_empty() {
                let rest: Vec<PreparedOp> = index.iter().map(|&i| kept[i].clone()).collect();
                let over_tcp = links.tcp.run_batch(&self.inner, peer, rest).await;
                results.merge(index, BatchResults::from_slots(over_tcp).finish());
            }
        }
        results.finish()
    }

    fn peer(&self, peer: &str) -> Arc<PeerLinks> {
        lock(&self.peers)
            .entry(peer.to_string())
            .or_insert_with(|| Arc::new(PeerLinks::new(self.nic.clone(), self.speeds.clone())))
            .clone()
    }
}

impl Drop for Transports {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

/// Every [`SWEEP_EVERY`], on a timer: close the idle tcp connections to
/// every peer that the peer has closed or that sat idle past
/// `idle_timeout_ms`. A killed peer's connections otherwise stay in
/// CLOSE_WAIT until something sweeps them. A sweep run only by the next
/// batch leaves them there for good when no batch comes: the soak under
/// load would end with 3-8 such sockets to a restarted engine on both other
/// engines. One peek per idle connection per second costs nothing at
/// hundreds of peers.
async fn sweep_idle(peers: Peers, limits: IdleLimits) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now = Instant::now();
        let all: Vec<Arc<PeerLinks>> = lock(&peers).values().cloned().collect();
        for l in all {
            l.tcp.sweep(limits, now);
        }
    }
}

/// What this engine keeps for one peer: the transport decided for it and
/// the links of every transport.
struct PeerLinks {
    chosen: Mutex<Option<Transport>>,
    tcp: TcpPeer,
    shm: ShmPeer,
    rdma: RdmaPeer,
}

impl PeerLinks {
    fn new(nic: Arc<Nic>, speeds: Arc<CodecSpeeds>) -> Self {
        PeerLinks {
            chosen: Mutex::new(None),
            tcp: TcpPeer::new(speeds),
            shm: ShmPeer::default(),
            rdma: RdmaPeer::new(nic),
        }
    }

    /// The transport decided for this peer, while its links work.
    fn chosen(&self) -> Option<Transport> {
        let t = (*lock(&self.chosen))?;
        let ready = match t {
            Transport::Tcp => true,
            Transport::Shm => self.shm.ready(),
            Transport::Rdma => self.rdma.ready(),
        };
        ready.then_some(t)
    }

    /// The transport for the next batch: the one decided, while its links work.
    async fn choose(&self, inner: &Inner, peer: &str) -> Result<Transport, TransferError> {
        if let Some(t) = self.chosen() {
            return Ok(t);
        }
        let choice = inner.config.transport;
        let t = if choice == TransportChoice::Tcp {
            Transport::Tcp
        } else {
            self.decide(inner, peer, choice).await?
        };
        *lock(&self.chosen) = Some(t);
        Ok(t)
    }

    /// Say hello to the peer and pick: shm on the same host, then rdma where
    /// both ends have a device, else tcp (an explicit `shm` or `rdma` choice
    /// that cannot be met is an error instead).
    async fn decide(
        &self,
        inner: &Inner,
        peer: &str,
        choice: TransportChoice,
    ) -> Result<Transport, TransferError> {
        let (conn, hello) = client::connect(inner, peer).await?;
        self.tcp
            .put_back(vec![conn], false, IdleLimits::of(&inner.config));
        let same_host = inner.hello.same_host(&hello);
        if matches!(choice, TransportChoice::Auto | TransportChoice::Shm) && same_host {
            match self.shm.open(inner, hello.shm_socket.clone()) {
                Ok(()) => return Ok(Transport::Shm),
                Err(e) if choice == TransportChoice::Shm => return Err(e),
                Err(e) => tracing::warn!(%peer, error = %e, "shm link failed, not using shm"),
            }
        }
        if choice == TransportChoice::Shm {
            return Err(TransferError::Unsupported(Missing::ShmRemote {
                peer: peer.to_string(),
            }));
        }
        if tcp::conn::secured(inner).is_some() {
            // One-sided verbs cannot show a capability: secured modes use tcp.
            return match choice {
                TransportChoice::Rdma => Err(TransferError::Unsupported(Missing::RdmaSecured)),
                _ => Ok(Transport::Tcp),
            };
        }
        match self.rdma.open(inner, peer, &hello).await {
            Ok(()) => Ok(Transport::Rdma),
            Err(e) if choice == TransportChoice::Rdma => Err(e),
            Err(_) => Ok(Transport::Tcp),
        }
    }
}
