//! [`Client`]: a client of one kvfabric node, and [`Transfer`], a batch of
//! block reads or writes in flight.
//!
//! The client speaks the node's gRPC CacheService (over mutual TLS with a
//! tool's or tenant's certificate when the cluster is secured, with the
//! tenant's API key when the node has a tenants file). The node finds the
//! best holder of each block across the cluster and reads it itself, so a
//! client needs only its own node's address. Every call releases the GIL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kvfabric_node::cluster::client::{connect_lazy_with, CacheClient};
use kvfabric_proto::v1::{ExistsRequest, LookupRequest, StatsRequest};
use kvfabric_transfer::security::{NodeIdentity, SecurityConfig, SecurityMode};
use kvfabric_types::BlockKey;
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tonic::metadata::AsciiMetadataValue;

use crate::conn::Conn;
use crate::error::PyClientError;
use crate::keys::{key_of, Layout};
use crate::segments::{Access, Segments, Span};
use crate::wire::{self, Got};

/// Blocks of one batch in flight at once.
const BATCH_CONCURRENCY: usize = 16;

/// A multi-threaded runtime for the client's (or embedded node's) tasks.
pub(crate) fn runtime(threads: usize) -> Result<Arc<Runtime>, PyClientError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("kvfabric")
        .enable_all()
        .build()
        .map(Arc::new)
        .map_err(|e| PyClientError::Local {
            what: "starting the client's runtime",
            reason: e.to_string(),
        })
}

/// A client of one kvfabric node.
#[pyclass(module = "kvfabric._native", frozen)]
pub struct Client {
    rt: Arc<Runtime>,
    conn: Conn,
}

impl Client {
    /// A client of `addr` on the runtime `rt`.
    pub(crate) fn open(
        rt: Arc<Runtime>,
        addr: &str,
        api_key: Option<&str>,
        tls: Option<(&str, &str)>,
        timeout: Duration,
    ) -> Result<Self, PyClientError> {
        let identity = tls.map(|(dir, name)| identity(dir, name)).transpose()?;
        let bearer = api_key
            .map(|k| {
                format!("Bearer {k}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| PyClientError::arg("api_key", "not printable ASCII"))
            })
            .transpose()?;
        let client = {
            let _in = rt.enter();
            connect_lazy_with(addr, timeout, identity.as_deref()).map_err(|e| {
                PyClientError::Connect {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                }
            })?
        };
        Ok(Client {
            rt,
            conn: Conn {
                client,
                addr: addr.to_string(),
                bearer,
                timeout,
            },
        })
    }

    /// Run `keys`' batch over `segments` on the runtime; `op` does one
    /// block. `skip_present`: ask the node first which keys it has, and
    /// answer those `false` without running `op` (a put of a block the
    /// cluster has moves no bytes).
    fn start<F, Fut>(
        &self,
        keys: Vec<BlockKey>,
        segments: Segments,
        skip_present: bool,
        op: F,
    ) -> Transfer
    where
        F: Fn(Conn, BlockKey, Vec<Span>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<bool, PyClientError>> + Send + 'static,
    {
        let conn = self.conn.clone();
        let spans = segments.blocks.clone();
        let task = self.rt.spawn(async move {
            let present = if skip_present {
                present(&conn, &keys).await
            } else {
                vec![false; keys.len()]
            };
            let results: Vec<Result<bool, PyClientError>> =
                futures::stream::iter(keys.into_iter().zip(spans).zip(present))
                    .map(|((k, s), p)| {
                        let run = (!p).then(|| op(conn.clone(), k, s));
                        async move {
                            match run {
                                Some(f) => f.await,
                                None => Ok(false),
                            }
                        }
                    })
                    .buffered(BATCH_CONCURRENCY)
                    .collect()
                    .await;
            results.into_iter().collect()
        });
        Transfer {
            rt: self.rt.clone(),
            state: Mutex::new(State::Running(task)),
            _segments: segments,
        }
    }
}

impl Client {
    /// One unary call `f` on the node, the GIL released while it runs.
    fn unary<T, F, Fut>(&self, py: Python<'_>, call: &'static str, f: F) -> PyResult<T>
    where
        F: FnOnce(CacheClient, Conn) -> Fut + Send,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
        T: Send,
    {
        let conn = self.conn.clone();
        let r = py.detach(|| self.rt.block_on(f(conn.client.clone(), conn)));
        Ok(r.map_err(|s| self.conn.error(call, &s))?.into_inner())
    }
}

/// The identity of certificate `name` in `dir` (`kvfabric certs init` layout).
fn identity(dir: &str, name: &str) -> Result<Arc<NodeIdentity>, PyClientError> {
    let cfg = SecurityConfig::from_dir(std::path::Path::new(dir), name, SecurityMode::Authenticate);
    NodeIdentity::load(&cfg)
        .map_err(|e| PyClientError::arg("tls_dir", e.to_string()))?
        .ok_or_else(|| PyClientError::arg("tls_dir", "no certificate loaded"))
}

/// Keys from Python bytes, refusing any that is not 32 bytes.
fn keys_of(keys: Vec<Vec<u8>>) -> Result<Vec<BlockKey>, PyClientError> {
    keys.iter().map(|k| key_of(k)).collect()
}

/// `buffers` for `keys`: one entry per key.
fn segments_for(
    keys: &[BlockKey],
    buffers: &Bound<'_, PyAny>,
    access: Access,
) -> PyResult<Segments> {
    let segs = Segments::extract(buffers, access)?;
    if segs.blocks.len() != keys.len() {
        return Err(PyClientError::arg(
            "buffers",
            format!(
                "{} blocks of buffers for {} keys",
                segs.blocks.len(),
                keys.len()
            ),
        )
        .into());
    }
    Ok(segs)
}

/// Which of `keys` the cluster holds; all `false` when the node cannot say
/// (the puts then go ahead: a put of a present block changes nothing).
async fn present(conn: &Conn, keys: &[BlockKey]) -> Vec<bool> {
    let req = ExistsRequest {
        keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
    };
    match conn.client.clone().exists(conn.request(req)).await {
        Ok(r) if r.get_ref().present.len() == keys.len() => r.into_inner().present,
        _ => vec![false; keys.len()],
    }
}

/// One block's get, bounded by the client's deadline (a stream that stalls
/// after its header ends too; nothing is written after it): a miss, an
/// unusable block or a deadline is `false`; only errors that concern the
/// whole batch (a refused caller) fail it.
async fn get_one(conn: Conn, key: BlockKey, spans: Vec<Span>) -> Result<bool, PyClientError> {
    let Ok(got) = tokio::time::timeout(conn.timeout, wire::get_into(&conn, &key, &spans)).await
    else {
        tracing::debug!(node = %conn.addr, key = %key.to_hex(), "block read ran past the deadline; counted as a miss");
        return Ok(false);
    };
    match got {
        Ok(Got::Loaded) => Ok(true),
        Ok(Got::Missing) => Ok(false),
        Ok(Got::Unusable(why)) => {
            tracing::warn!(node = %conn.addr, key = %key.to_hex(), "block arrived with {why}; counted as a miss");
            Ok(false)
        }
        Err(e) if e.is_fatal() => Err(e),
        Err(e) => {
            tracing::debug!(node = %conn.addr, error = %e, "block read failed; counted as a miss");
            Ok(false)
        }
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (addr, api_key = None, tls_dir = None, tls_name = None, timeout_s = 5.0))]
    fn new(
        addr: &str,
        api_key: Option<&str>,
        tls_dir: Option<&str>,
        tls_name: Option<&str>,
        timeout_s: f64,
    ) -> PyResult<Self> {
        let tls =
            match (tls_dir, tls_name) {
                (Some(d), Some(n)) => Some((d, n)),
                (None, None) => None,
                _ => return Err(PyClientError::arg(
                    "tls_dir",
                    "give tls_dir and tls_name together (the certificate's name in the directory)",
                )
                .into()),
            };
        if !(timeout_s > 0.0 && timeout_s.is_finite()) {
            return Err(PyClientError::arg("timeout_s", format!("{timeout_s}: want > 0")).into());
        }
        let rt = runtime(2)?;
        Ok(Client::open(
            rt,
            addr,
            api_key,
            tls,
            Duration::from_secs_f64(timeout_s),
        )?)
    }

    /// The node's address.
    #[getter]
    fn addr(&self) -> &str {
        &self.conn.addr
    }

    /// The node's id (a round trip).
    fn node_id(&self, py: Python<'_>) -> PyResult<String> {
        let r = self.unary(py, "stats", |mut c, conn| async move {
            c.stats(conn.request(StatsRequest {})).await
        })?;
        Ok(r.node_id)
    }

    /// How many leading keys some node of the cluster holds.
    fn lookup(&self, py: Python<'_>, keys: Vec<Vec<u8>>) -> PyResult<usize> {
        let keys = keys_of(keys)?;
        let req = LookupRequest {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            with_holders: false,
        };
        let r = self.unary(py, "lookup", |mut c, conn| async move {
            c.lookup(conn.request(req)).await
        })?;
        Ok((r.prefix_blocks as usize).min(keys.len()))
    }

    /// Whether some node holds each key.
    fn exists(&self, py: Python<'_>, keys: Vec<Vec<u8>>) -> PyResult<Vec<bool>> {
        let keys = keys_of(keys)?;
        let n = keys.len();
        let req = ExistsRequest {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
        };
        let present = self
            .unary(py, "exists", |mut c, conn| async move {
                c.exists(conn.request(req)).await
            })?
            .present;
        if present.len() != n {
            return Err(PyClientError::Node {
                addr: self.conn.addr.clone(),
                call: "exists",
                code: tonic::Code::Internal,
                message: format!("{} answers for {n} keys", present.len()),
            }
            .into());
        }
        Ok(present)
    }

    /// Start reading each block into its buffers.
    fn start_get_into(&self, keys: Vec<Vec<u8>>, buffers: &Bound<'_, PyAny>) -> PyResult<Transfer> {
        let keys = keys_of(keys)?;
        let segs = segments_for(&keys, buffers, Access::Write)?;
        Ok(self.start(keys, segs, false, get_one))
    }

    /// Read each block into its buffers: True loaded (checksum verified),
    /// False a miss or an unusable block (its buffers may be partly written).
    fn get_into(
        &self,
        py: Python<'_>,
        keys: Vec<Vec<u8>>,
        buffers: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<bool>> {
        self.start_get_into(keys, buffers)?.wait(py, None)
    }

    /// Start storing each block from its buffers, as `owner` (a trusted
    /// caller's tenant to count the block to; None: the caller's own).
    /// `skip_present`: first ask which blocks the cluster has, and send
    /// only the others.
    #[pyo3(signature = (keys, layout, buffers, owner = None, skip_present = true))]
    fn start_put(
        &self,
        keys: Vec<Vec<u8>>,
        layout: &Layout,
        buffers: &Bound<'_, PyAny>,
        owner: Option<String>,
        skip_present: bool,
    ) -> PyResult<Transfer> {
        let keys = keys_of(keys)?;
        let segs = segments_for(&keys, buffers, Access::Read)?;
        let want = layout.inner.block_bytes();
        if let Some(i) = (0..keys.len()).find(|&i| segs.block_len(i) != want) {
            return Err(PyClientError::arg(
                "buffers",
                format!(
                    "block {i} has {} bytes, the layout's blocks {want}",
                    segs.block_len(i)
                ),
            )
            .into());
        }
        let layout = layout.inner;
        let owner: Option<Arc<str>> = owner.map(Arc::from);
        Ok(
            self.start(keys, segs, skip_present, move |conn, key, spans| {
                let owner = owner.clone();
                async move { wire::put_from(&conn, &key, &layout, &spans, owner.as_deref()).await }
            }),
        )
    }

    /// Store each block from its buffers: True stored, False already present.
    #[pyo3(signature = (keys, layout, buffers, owner = None, skip_present = true))]
    fn put(
        &self,
        py: Python<'_>,
        keys: Vec<Vec<u8>>,
        layout: &Layout,
        buffers: &Bound<'_, PyAny>,
        owner: Option<String>,
        skip_present: bool,
    ) -> PyResult<Vec<bool>> {
        self.start_put(keys, layout, buffers, owner, skip_present)?
            .wait(py, None)
    }

    fn __repr__(&self) -> String {
        format!("Client(addr='{}')", self.conn.addr)
    }
}

/// Where a batch is.
enum State {
    Running(JoinHandle<Result<Vec<bool>, PyClientError>>),
    Done(Result<Vec<bool>, PyClientError>),
}

/// A batch in flight; it holds its buffers until it ends.
#[pyclass(module = "kvfabric._native", frozen)]
pub struct Transfer {
    rt: Arc<Runtime>,
    state: Mutex<State>,
    _segments: Segments,
}

#[pymethods]
impl Transfer {
    /// Whether the batch has ended.
    fn done(&self) -> bool {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Running(h) => h.is_finished(),
            State::Done(_) => true,
        }
    }

    /// Cancel the batch: when this returns, it no longer reads or writes
    /// its buffers (blocks it had finished keep their results; `wait`
    /// then raises KvfabricError unless it had ended already).
    fn cancel(&self, py: Python<'_>) {
        py.detach(|| self.stop());
    }

    /// Per block: True when loaded (get) or newly stored (put). Raises
    /// Timeout if it has not ended within `timeout_s`.
    #[pyo3(signature = (timeout_s = None))]
    fn wait(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<Vec<bool>> {
        let limit = timeout_s
            .map(|t| {
                Duration::try_from_secs_f64(t)
                    .map_err(|_| PyClientError::arg("timeout_s", format!("{t}: want >= 0")))
            })
            .transpose()?;
        let r = py.detach(|| {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let State::Running(h) = &mut *st {
                let ended = self.rt.block_on(async {
                    match limit {
                        Some(t) => tokio::time::timeout(t, h).await.ok(),
                        None => Some(h.await),
                    }
                });
                let Some(joined) = ended else {
                    return Err(PyClientError::Timeout {
                        what: "the batch",
                        after: limit.unwrap_or_default(),
                    });
                };
                *st = State::Done(joined.unwrap_or_else(|e| {
                    Err(PyClientError::Local {
                        what: "the batch's task",
                        reason: e.to_string(),
                    })
                }));
            }
            match &*st {
                State::Done(r) => r.clone(),
                State::Running(_) => unreachable!("joined above"),
            }
        });
        Ok(r?)
    }
}

impl Transfer {
    /// Stop the batch if it runs, and wait until it no longer touches the
    /// buffers; an ended batch keeps its results.
    fn stop(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let State::Running(h) = &mut *st {
            h.abort();
            let joined = self.rt.block_on(h);
            *st = State::Done(joined.unwrap_or_else(|_| {
                Err(PyClientError::Local {
                    what: "the batch",
                    reason: "cancelled".into(),
                })
            }));
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        // The task writes into (or reads from) the buffers this object
        // holds: it must have ended before they are let go.
        self.stop();
    }
}
