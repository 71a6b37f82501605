//! Bounded polling: every wait in a test has a deadline and says what it
//! waited for when it runs out.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll `f` every 100 ms until it returns Some, for at most `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut f: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return (v, start.elapsed());
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
