//! The batch API's routes: `/v1/files` (upload, list, retrieve, content,
//! delete) and `/v1/batches` (create, retrieve, list, cancel), OpenAI's
//! shapes; the jobs themselves are `crate::batch`. Also [`execute`], which
//! runs one batch line through the very handler an interactive request
//! takes, so a bad line gets the same 400 body it would get interactively.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use kvfabric_tenants::Identity;

use super::completions;
use super::openai::{parse_body, ApiError};
use super::state::HttpState;
use crate::batch::{multipart, BatchExecutor, BatchObject, BatchService, FileObject};
use crate::clock::unix_now;

/// The endpoints a batch may target.
const ENDPOINTS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

/// Run one batch request body against `endpoint` as an interactive request
/// would run (same validation, same answer); the status and JSON body.
pub(crate) async fn execute(
    state: &HttpState,
    who: Identity,
    endpoint: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let (state, who, headers, body) = (
        State(Arc::new(state.clone())),
        Extension(who),
        HeaderMap::new(),
        Ok(Bytes::from(body)),
    );
    let response = if endpoint == "/v1/completions" {
        completions::completions(state, who, headers, body).await
    } else {
        completions::chat_completions(state, who, headers, body).await
    };
    let status = response.status().as_u16();
    let body = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            ApiError::server(StatusCode::BAD_GATEWAY, format!("non-JSON answer: {e}")).body()
        }),
        Err(e) => {
            ApiError::server(StatusCode::BAD_GATEWAY, format!("reading the answer: {e}")).body()
        }
    };
    (status, body)
}

/// The batch runner runs its lines through [`execute`].
impl BatchExecutor for HttpState {
    fn execute(
        &self,
        who: Identity,
        endpoint: &str,
        body: Vec<u8>,
    ) -> impl std::future::Future<Output = (u16, Value)> + Send {
        execute(self, who, endpoint, body)
    }

    fn identity_of(&self, owner: &str) -> Option<Identity> {
        self.tenants.identity_of(owner)
    }
}

fn service(state: &HttpState) -> Result<&Arc<BatchService>, ApiError> {
    state.batches.as_ref().ok_or_else(|| {
        ApiError::invalid("the batch API is not enabled on this server", None)
            .with_status(StatusCode::NOT_FOUND)
    })
}

fn store_error(e: crate::EngineError) -> ApiError {
    ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

fn not_found(what: &str, id: &str, param: &str) -> ApiError {
    ApiError::invalid(format!("No {what} with id '{id}' found"), Some(param))
        .with_status(StatusCode::NOT_FOUND)
        .with_code("not_found")
}

fn answer(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

/// The file `id` if it exists and `who` owns it.
fn owned_file(svc: &BatchService, who: &Identity, id: &str) -> Result<FileObject, ApiError> {
    svc.catalog
        .file(id)
        .map_err(store_error)?
        .filter(|f| f.owner == who.label())
        .ok_or_else(|| not_found("file", id, "file_id"))
}

/// The batch `id` if it exists and `who` owns it.
fn owned_batch(svc: &BatchService, who: &Identity, id: &str) -> Result<BatchObject, ApiError> {
    svc.catalog
        .batch(id)
        .map_err(store_error)?
        .filter(|b| b.owner == who.label())
        .ok_or_else(|| not_found("batch", id, "batch_id"))
}

pub(super) async fn upload_file(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(upload(&state, &who, &headers, body))
}

fn upload(
    state: &HttpState,
    who: &Identity,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let svc = service(state)?;
    let body = body.map_err(|e| {
        ApiError::invalid(format!("could not read the upload: {e}"), Some("file"))
            .with_status(e.status())
    })?;
    let boundary = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(multipart::boundary)
        .ok_or_else(|| ApiError::invalid("the upload must be multipart/form-data", None))?;
    let parts = multipart::parse(&body, &boundary).map_err(|e| ApiError::invalid(e, None))?;
    let field = |name: &str| parts.iter().find(|p| p.name == name);
    let purpose = field("purpose").map(|p| String::from_utf8_lossy(p.data).into_owned());
    if purpose.as_deref() != Some("batch") {
        return Err(ApiError::invalid(
            format!("purpose must be 'batch', got {purpose:?}"),
            Some("purpose"),
        ));
    }
    let file = field("file").ok_or_else(|| ApiError::invalid("no 'file' part", Some("file")))?;
    if file.data.len() as u64 > svc.cfg.max_file_bytes.as_u64() {
        return Err(ApiError::invalid(
            format!("the file is larger than {}", svc.cfg.max_file_bytes),
            Some("file"),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE));
    }
    let object = FileObject {
        id: state.request_id("file"),
        object: "file".into(),
        bytes: file.data.len() as u64,
        created_at: unix_now(),
        filename: file
            .filename
            .clone()
            .unwrap_or_else(|| "upload.jsonl".into()),
        purpose: "batch".into(),
        status: "processed".into(),
        owner: who.label().to_owned(),
    };
    svc.catalog
        .put_file(&object, file.data)
        .map_err(store_error)?;
    Ok(axum::Json(object.wire()).into_response())
}

pub(super) async fn list_files(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
) -> Response {
    answer((|| {
        let files = service(&state)?.catalog.files().map_err(store_error)?;
        let data: Vec<Value> = files
            .iter()
            .filter(|f| f.owner == who.label())
            .map(FileObject::wire)
            .collect();
        Ok(axum::Json(json!({"object": "list", "data": data, "has_more": false})).into_response())
    })())
}

pub(super) async fn get_file(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    answer(service(&state).and_then(|svc| {
        let f = owned_file(svc, &who, &id)?;
        Ok(axum::Json(f.wire()).into_response())
    }))
}

pub(super) async fn file_content(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    answer(service(&state).and_then(|svc| {
        owned_file(svc, &who, &id)?;
        let content = svc.catalog.file_content(&id).map_err(store_error)?;
        let content = content.ok_or_else(|| not_found("file", &id, "file_id"))?;
        Ok(([(header::CONTENT_TYPE, "application/jsonl")], content).into_response())
    }))
}

pub(super) async fn delete_file(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    answer(service(&state).and_then(|svc| {
        owned_file(svc, &who, &id)?;
        svc.catalog.delete_file(&id).map_err(store_error)?;
        Ok(axum::Json(json!({"id": id, "object": "file", "deleted": true})).into_response())
    }))
}

/// `POST /v1/batches` body.
#[derive(Debug, Deserialize)]
struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    metadata: Option<Value>,
}

pub(super) async fn create_batch(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer((|| {
        let svc = service(&state)?;
        let body = body.map_err(|e| {
            ApiError::invalid(format!("could not read the request body: {e}"), None)
                .with_status(e.status())
        })?;
        let req: CreateBatch = parse_body(&body)?;
        if !ENDPOINTS.contains(&req.endpoint.as_str()) {
            return Err(ApiError::invalid(
                format!(
                    "endpoint must be one of {ENDPOINTS:?}, got '{}'",
                    req.endpoint
                ),
                Some("endpoint"),
            ));
        }
        if req.completion_window != "24h" {
            return Err(ApiError::invalid(
                "completion_window must be '24h'",
                Some("completion_window"),
            ));
        }
        let input = owned_file(svc, &who, &req.input_file_id).map_err(|e| ApiError {
            param: Some("input_file_id".into()),
            ..e
        })?;
        if input.purpose != "batch" {
            return Err(ApiError::invalid(
                "the input file's purpose must be 'batch'",
                Some("input_file_id"),
            ));
        }
        let id = state.request_id("batch");
        let b = svc
            .create(id, &input, &req.endpoint, req.metadata, &who)
            .map_err(store_error)?;
        Ok(axum::Json(b.wire()).into_response())
    })())
}

pub(super) async fn get_batch(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    answer(
        service(&state)
            .and_then(|svc| Ok(axum::Json(owned_batch(svc, &who, &id)?.wire()).into_response())),
    )
}

pub(super) async fn cancel_batch(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    answer(service(&state).and_then(|svc| {
        owned_batch(svc, &who, &id)?;
        let b = svc.cancel(&id).map_err(store_error)?;
        let b = b.ok_or_else(|| not_found("batch", &id, "batch_id"))?;
        Ok(axum::Json(b.wire()).into_response())
    }))
}

/// `GET /v1/batches?limit=&after=`: newest first, as OpenAI lists them.
pub(super) async fn list_batches(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    RawQuery(query): RawQuery,
) -> Response {
    answer(service(&state).and_then(|svc| {
        let q: HashMap<&str, &str> = query
            .as_deref()
            .unwrap_or_default()
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let limit = match q.get("limit") {
            None => 20,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|l| (1..=100).contains(l))
                .ok_or_else(|| ApiError::invalid("limit must be 1..=100", Some("limit")))?,
        };
        let mut all = svc.catalog.batches().map_err(store_error)?;
        all.retain(|b| b.owner == who.label());
        all.reverse();
        let start = match q.get("after") {
            None => 0,
            Some(after) => all
                .iter()
                .position(|b| b.id == *after)
                .map_or(all.len(), |i| i + 1),
        };
        let page: Vec<Value> = all
            .iter()
            .skip(start)
            .take(limit)
            .map(|b| b.wire())
            .collect();
        let has_more = all.len() > start + page.len();
        Ok(axum::Json(json!({
            "object": "list",
            "data": page,
            "first_id": page.first().and_then(|b| b.get("id")),
            "last_id": page.last().and_then(|b| b.get("id")),
            "has_more": has_more,
        }))
        .into_response())
    }))
}
