//! The engine tests' shared setup (feature `engine`): the reference model
//! ([`model_path`], [`model`]), a direct driver of the forward pass with no
//! scheduler ([`driver`]), requests to a running scheduler from a blocking
//! test ([`requests`]), the real engine behind the OpenAI HTTP API on
//! 127.0.0.1:0 ([`server`]), and a scripted scheduler stand-in behind the same
//! API with a small hyper client ([`http`]), and real engines served for
//! what stands in front of them, recording what reached them ([`serve`]).

pub mod driver;
pub mod http;
mod model;
pub mod requests;
pub mod serve;
pub mod server;

pub use model::{model, model_path};

use std::net::SocketAddr;

use kvfabric_engine::http::{serve, HttpState};
use kvfabric_engine::EngineError;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `state` served on 127.0.0.1:0: the address, the sender that starts a
/// graceful shutdown (sent or dropped), the serve task.
pub async fn serve_on_loopback(
    state: HttpState,
) -> (
    SocketAddr,
    oneshot::Sender<()>,
    JoinHandle<Result<(), EngineError>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (shutdown, stop) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, state, async move {
        let _ = stop.await;
    }));
    (addr, shutdown, task)
}
