//! gRPC server reflection on a node: both protocol versions list the
//! kvfabric services. grpcurl before 1.8 and grpcio-reflection's client
//! speak only `grpc.reflection.v1alpha`; newer clients try `v1` first.

use kvfabric_node::NodeServer;
use kvfabric_store::{NodeConfig, Registry, Store};
use tonic_reflection::pb::{v1, v1alpha};

/// A standalone RAM-only node; its gRPC URL and the sender that stops it.
async fn start() -> (String, tokio::sync::oneshot::Sender<()>) {
    let mut registry = Registry::default();
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::mib(4),
        ..Default::default()
    };
    let store = Store::open(cfg, &mut registry).expect("store");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let g = grpc.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        NodeServer::standalone(store, registry, grpc, http).serve(async {
            let _ = rx.await;
        }),
    );
    (format!("http://{g}"), tx)
}

async fn connect(url: &str) -> tonic::transport::Channel {
    for _ in 0..100 {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
        {
            return ch;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("node at {url} did not come up");
}

/// The service names a reflection client of protocol module `$v` (`v1` or
/// `v1alpha`: the same messages, generated twice) lists at `$url`. A macro,
/// not a function: the two modules share no trait.
macro_rules! list_services {
    ($v:ident, $url:expr) => {{
        let mut c = $v::server_reflection_client::ServerReflectionClient::new(connect($url).await);
        let req = $v::ServerReflectionRequest {
            host: String::new(),
            message_request: Some($v::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        let mut answers = c
            .server_reflection_info(tokio_stream::once(req))
            .await
            .expect(concat!(
                stringify!($v),
                " reflection answers (UNIMPLEMENTED before)"
            ))
            .into_inner();
        let answer = answers.message().await.unwrap().expect("one answer");
        let Some($v::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
            answer.message_response
        else {
            panic!("not a service list: {answer:?}");
        };
        list.service
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<String>>()
    }};
}

#[tokio::test]
async fn a_v1alpha_client_lists_the_services() {
    let (url, _stop) = start().await;
    let names = list_services!(v1alpha, &url);
    assert!(
        names.iter().any(|n| n == "kvfabric.v1.CacheService"),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_v1_client_lists_the_services() {
    let (url, _stop) = start().await;
    let names = list_services!(v1, &url);
    assert!(
        names.iter().any(|n| n == "kvfabric.v1.CacheService"),
        "{names:?}"
    );
}
