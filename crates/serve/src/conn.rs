//! Serving HTTP/1.1 connections with the limits a server exposed to arbitrary clients needs:
//!
//! - `TCP_NODELAY` on every accepted socket: a token's chunk is a few hundred bytes, and with
//!   Nagle's algorithm each would wait for the client's delayed ACK, so tokens would leave in
//!   bursts instead of when the engine makes them.
//! - A bound on open connections: past it a connection is answered 503 with Retry-After at once
//!   and closed, so a flood cannot take the file descriptors the server needs.
//! - A header-read timeout (from a connection's first byte of a request, or its opening, to the
//!   end of the head) and a keep-alive idle timeout (between requests): a client that sends half
//!   a header or sits idle is closed. hyper's own header timer also runs while a connection is
//!   idle, so one clock cannot give the two values; each connection's watchdog keeps both.
//! - Graceful shutdown: on stop, no new connections; open ones finish their answers.

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Connection counts, served at `/health`.
#[derive(Debug, Default)]
pub struct ConnectionState {
    pub open: AtomicUsize,
    /// The bound in force (the configured one, lowered to fit the file-descriptor limit).
    pub max: AtomicUsize,
    /// Connections answered 503 because the bound was reached.
    pub refused: AtomicUsize,
    /// Connections closed for a header or idle timeout.
    pub timed_out: AtomicUsize,
}

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting for (or reading) a request head since then.
    Head(Instant),
    /// This many requests are being answered.
    Busy(usize),
    /// Idle between requests since then.
    Idle(Instant),
}

/// One connection's phase, shared by its socket, its service and its watchdog.
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    /// Moves to the phase `f` gives; wakes the watchdog only when that is a change (a socket
    /// read inside a request changes nothing).
    fn update(&self, f: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let next = f(*phase);
        if next != *phase {
            *phase = next;
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// When the phase's timeout runs out, if it has one.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        match *self.phase.lock().unwrap_or_else(|e| e.into_inner()) {
            Phase::Head(since) => Some(since + limits.header_timeout),
            Phase::Idle(since) => Some(since + limits.idle_timeout),
            Phase::Busy(_) => None,
        }
    }
}

/// Ends a request's part in its connection's phase when dropped: when the answer's body is done
/// or abandoned, or the handler is dropped before answering.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.update(|phase| match phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        });
    }
}

/// A response body that holds its request's guard until it is done.
struct Guarded {
    inner: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, telling its connection's activity when a request's first byte arrives.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.update(|phase| match phase {
                Phase::Idle(_) => Phase::Head(Instant::now()),
                other => other,
            });
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The answer to a connection past the bound, written before its request is read.
fn refusal(max: usize) -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "message": format!("the server holds its maximum of {max} open connections; retry later"),
        "type": "overloaded_error", "code": 503}})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Accepts and serves connections until `shutdown` changes, then waits for the open ones to
/// finish their answers.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    state: Arc<ConnectionState>,
    mut shutdown: watch::Receiver<bool>,
) {
    state.max.store(limits.max_connections, Ordering::SeqCst);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // Refusals in flight are bounded too: past that, a surplus connection is just closed.
    let refusals = Arc::new(Semaphore::new(16));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors or a connection reset before it was taken: wait and
                    // go on, as a server must.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        while tasks.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            state.refused.fetch_add(1, Ordering::SeqCst);
            if let Ok(slot) = refusals.clone().try_acquire_owned() {
                tasks.spawn(async move {
                    refuse(stream, limits.max_connections).await;
                    drop(slot);
                });
            }
            continue;
        };
        let (router, state, shutdown) = (router.clone(), state.clone(), shutdown.clone());
        tasks.spawn(async move {
            state.open.fetch_add(1, Ordering::SeqCst);
            connection(stream, router, limits, &state, shutdown).await;
            state.open.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
        });
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// Writes the refusal, reads what the client sends until it pauses (closing with unread data
/// would reset the connection before the client reads the answer), and closes. A refusal holds
/// its slot for a second at most, and a client that sent its request and waits for the answer
/// for a tenth of one.
async fn refuse(mut stream: TcpStream, max: usize) {
    let deadline = Instant::now() + Duration::from_secs(1);
    let wrote = tokio::time::timeout_at(deadline, stream.write_all(&refusal(max))).await;
    if matches!(wrote, Ok(Ok(()))) {
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let pause = Duration::from_millis(100);
        while Instant::now() < deadline {
            match tokio::time::timeout(pause, stream.read(&mut sink)).await {
                Ok(Ok(n)) if n > 0 => continue,
                _ => break,
            }
        }
    }
}

/// Serves one connection under its watchdog.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    state: &ConnectionState,
    mut shutdown: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity { phase: Mutex::new(Phase::Head(Instant::now())), changed: Notify::new() });
    let io = TokioIo::new(Watched { stream, activity: activity.clone() });
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        service_activity.update(|phase| match phase {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
        let guard = RequestGuard(service_activity.clone());
        let answer = tower::ServiceExt::oneshot(router.clone(), request);
        async move {
            let response = answer.await?;
            Ok::<_, std::convert::Infallible>(response.map(|inner| Body::new(Guarded { inner, _guard: guard })))
        }
    });
    // hyper's header timer is off: it would also close idle keep-alive connections at the header
    // timeout. The watchdog below keeps both clocks.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None).keep_alive(true);
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stopping = *shutdown.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let changed = activity.changed.notified();
        let deadline = activity.deadline(&limits);
        let expiry = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = changed => {}
            _ = expiry => {
                if activity.deadline(&limits).is_some_and(|at| at <= Instant::now()) {
                    // No request is being answered: dropping the connection closes the socket.
                    state.timed_out.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            _ = shutdown.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
