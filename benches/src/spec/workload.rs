//! The prompts `kvfabric bench spec` generates from: an agentic
//! tool-calling workload whose answers copy their context (tool-call
//! arguments quoted from the conversation, code edits that echo a file, a
//! JSON record returned with one field changed), and free chat, whose
//! answers copy nothing. Each is rendered with the model's chat template; a
//! tool-calling answer starts with the opening the agent's format fixes
//! (`{"name": "read_file", ...` or a code fence), as constrained decoding
//! would.

use kvfabric_engine::chat::{ChatMessage, ChatTemplate};
use kvfabric_engine::tokenizer::Tokenizer;

const TOOLS: &str = r#"You are a coding agent working in the repository /work/kvfabric. You can call these tools:
{"name": "read_file", "description": "Read lines of a file", "arguments": {"path": "string", "start_line": "integer", "num_lines": "integer"}}
{"name": "run_command", "description": "Run a shell command", "arguments": {"command": "string", "cwd": "string"}}
{"name": "edit_file", "description": "Replace text in a file", "arguments": {"path": "string", "old_text": "string", "new_text": "string"}}
Answer with exactly one tool call as JSON: {"name": ..., "arguments": {...}}."#;

const CONFIG_PY: &str = r#"import os
from dataclasses import dataclass, field


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    timeout: int = 30
    max_connections: int = 128
    log_level: str = "info"
    allowed_origins: list = field(default_factory=list)

    @classmethod
    def from_env(cls) -> "ServerConfig":
        return cls(
            host=os.environ.get("SERVER_HOST", "127.0.0.1"),
            port=int(os.environ.get("SERVER_PORT", "8080")),
            timeout=int(os.environ.get("SERVER_TIMEOUT", "30")),
            max_connections=int(os.environ.get("SERVER_MAX_CONNECTIONS", "128")),
            log_level=os.environ.get("SERVER_LOG_LEVEL", "info"),
        )

    def validate(self) -> None:
        if self.port <= 0 or self.port > 65535:
            raise ValueError(f"bad port {self.port}")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")
"#;

const FRAME_RS: &str = r#"use std::io::{self, Read};

/// One frame header: kind, flags and payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub flags: u8,
    pub len: u32,
}

pub fn parse_header(buf: &[u8; 6]) -> Header {
    let len = u32::from_le_bytes([buf[2], buf[3], buf[4], buf[5]]);
    Header { kind: buf[0], flags: buf[1], len }
}

pub fn read_header<R: Read>(r: &mut R) -> io::Result<Header> {
    let mut buf = [0u8; 6];
    r.read_exact(&mut buf)?;
    Ok(parse_header(&buf))
}

pub fn read_frame<R: Read>(r: &mut R) -> io::Result<(Header, Vec<u8>)> {
    let header = read_header(r)?;
    let mut payload = vec![0u8; header.len as usize];
    r.read_exact(&mut payload)?;
    Ok((header, payload))
}
"#;

const RECORD: &str = r#"{"id": 4821, "name": "Alice Martin", "email": "alice.martin@example.com", "role": "maintainer", "teams": ["storage", "scheduler"], "created_at": "2024-03-18T09:41:00Z", "active": true, "quota": {"cpu": 8, "memory_gib": 32, "disk_gib": 500}}"#;

/// (system, user, start of the answer) of each tool-calling prompt.
fn tool_calling() -> Vec<(String, String, String)> {
    let tools = TOOLS.to_string();
    vec![
        (
            tools.clone(),
            "The test failed with: thread 'scheduler::tests::preempted_sequence_resumes' panicked at engine/src/scheduler/mod.rs:412:9. Read 30 lines of engine/src/scheduler/mod.rs from line 400.".into(),
            r#"{"name": "read_file", "arguments": {"path": ""#.into(),
        ),
        (
            tools.clone(),
            "Run cargo test -p kvfabric-engine --lib scheduler::tests::preempted_sequence_resumes -- --nocapture in /work/kvfabric/engine.".into(),
            r#"{"name": "run_command", "arguments": {"command": ""#.into(),
        ),
        (
            tools,
            format!("Here is src/config.py:\n```python\n{CONFIG_PY}```\nChange the default timeout from 30 to 60 and print the complete updated file."),
            "```python\n".into(),
        ),
        (
            "You are a careful coding assistant.".into(),
            format!("Here is src/frame.rs:\n```rust\n{FRAME_RS}```\nRename parse_header to decode_header everywhere and print the complete updated file."),
            "```rust\n".into(),
        ),
        (
            "You are a careful coding assistant.".into(),
            format!("Here is a user record:\n{RECORD}\nReturn the same record as JSON with the email changed to alice@kvfabric.dev."),
            "```json\n".into(),
        ),
    ]
}

fn free_chat() -> Vec<(String, String, String)> {
    [
        "Write a short poem about the ocean at night.",
        "Explain to a ten-year-old why the sky is blue.",
        "What are three good habits for staying healthy? Explain each briefly.",
        "Tell me a short story about a cat who wants to fly.",
    ]
    .iter()
    .map(|u| {
        (
            "You are a helpful assistant.".into(),
            u.to_string(),
            String::new(),
        )
    })
    .collect()
}

/// A workload: its name and its prompts' token ids.
pub type Workload = (&'static str, Vec<Vec<u32>>);

/// The workloads, as token ids.
pub fn workloads(tokenizer: &Tokenizer, template: &ChatTemplate) -> anyhow::Result<Vec<Workload>> {
    let encode = |set: Vec<(String, String, String)>| -> anyhow::Result<Vec<Vec<u32>>> {
        set.into_iter()
            .map(|(system, user, answer)| {
                let text = template.render(
                    &[
                        ChatMessage::new("system", system),
                        ChatMessage::new("user", user),
                    ],
                    true,
                )?;
                Ok(tokenizer.encode(&format!("{text}{answer}"), true))
            })
            .collect()
    };
    Ok(vec![
        ("tool_calling", encode(tool_calling())?),
        ("free_chat", encode(free_chat())?),
    ])
}
