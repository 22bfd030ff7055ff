//! The control socket of a running `up` (`.hostd/flow/control.sock`): the one way another
//! shell asks the flow's owner to change it (restart, add or withdraw services). Both ends
//! live here: [`ControlSocket`] is bound by `up` under the workspace lock and hands each
//! request to the supervisor; [`request`] is what `hostd flow restart|stop|up <svc>` call.
//!
//! The exchange is one JSON line each way: `{"version":1,"request":{"op":…}}`, answered by
//! `{"version":1,"answer":{"done":{…}}}` or `{"version":1,"answer":{"refused":{"code":…,
//! "message":…}}}`. Connections are bounded (a permit is taken before `accept`), a request
//! line is bounded, and a peer of another user is refused.
//!
//! This module owns the socket file, the wire format and its bounds. It must never change a
//! flow itself: the supervisor applies every change and writes the state. A socket file
//! nobody answers on (its `up` died) is stale: a client treats it as "not running", and the
//! next `up`, holding the lock, replaces it.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::change::{ChangeReport, ChangeRequest};
use crate::error::FlowError;
use crate::procfs::{self, Ownership};
use crate::state::{self, StatePaths};
use crate::supervisor::Command;

/// The wire format's version; a line of another version is refused.
pub const CONTROL_VERSION: u32 = 1;

/// The longest request line the owner reads.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;
/// The longest answer line a client reads (receipts of a large flow fit easily).
const MAX_ANSWER_BYTES: u64 = 4 * 1024 * 1024;
/// Requests served at once; the next connection waits for a permit before it is accepted.
const MAX_CONNECTIONS: usize = 8;
/// How long a connected peer may take to send its request line.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Unix socket paths longer than this are reached through the folder's descriptor
/// (`sun_path` holds 108 bytes including the terminator).
const MAX_DIRECT_PATH: usize = 100;

#[derive(Debug, Serialize, Deserialize)]
struct RequestLine {
    version: u32,
    request: ChangeRequest,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Answer {
    Done(ChangeReport),
    Refused { code: String, message: String },
}

#[derive(Debug, Serialize, Deserialize)]
struct AnswerLine {
    version: u32,
    answer: Answer,
}

/// Runs `f` with a path to `path` the kernel accepts for a unix socket: `path` itself when it
/// is short enough, else `/proc/self/fd/<folder>/<name>` through an open descriptor of its
/// folder.
fn with_socket_path<T>(path: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    if path.as_os_str().len() <= MAX_DIRECT_PATH {
        return f(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return f(path);
    };
    let folder = std::fs::File::open(dir)?;
    let short = Path::new("/proc/self/fd")
        .join(folder.as_raw_fd().to_string())
        .join(name);
    let result = f(&short);
    drop(folder);
    result
}

/// The listening end, bound by the `up` that holds the workspace lock. Dropping it stops
/// accepting and removes the socket file.
#[derive(Debug)]
pub(crate) struct ControlSocket {
    path: PathBuf,
    listener: Option<UnixListener>,
    owner_uid: u32,
    /// (device, inode) of the socket file this `up` created: only that file is removed.
    file: (u64, u64),
    task: Option<JoinHandle<()>>,
}

impl ControlSocket {
    /// Binds the workspace's control socket. Must only be called while holding the
    /// workspace lock: whatever socket file is there then belongs to an `up` that is gone.
    pub(crate) fn bind(paths: &StatePaths) -> Result<ControlSocket, FlowError> {
        let path = paths.control_socket.clone();
        let refuse = |e: io::Error| FlowError::Control {
            path: path.clone(),
            reason: format!("cannot listen: {e}"),
        };
        std::fs::create_dir_all(&paths.dir).map_err(&refuse)?;
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "removed a stale control socket"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(refuse(e)),
        }
        let listener = with_socket_path(&path, |p| UnixListener::bind(p)).map_err(&refuse)?;
        let meta = std::fs::metadata(&path).map_err(&refuse)?;
        Ok(ControlSocket {
            path,
            listener: Some(listener),
            owner_uid: meta.uid(),
            file: (meta.dev(), meta.ino()),
            task: None,
        })
    }

    /// Starts answering: each request goes to the supervisor behind `commands`. The socket
    /// holds only a weak sender, so it never keeps a flow alive whose handle was dropped.
    pub(crate) fn serve(&mut self, commands: mpsc::WeakSender<Command>) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let owner_uid = self.owner_uid;
        self.task = Some(tokio::spawn(accept_loop(listener, commands, owner_uid)));
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        // A later `up` may already have bound its own socket here (the lock is released
        // before this runs): that file is left alone.
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file);
        if ours && let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the control socket");
        }
    }
}

async fn accept_loop(listener: UnixListener, commands: mpsc::WeakSender<Command>, owner_uid: u32) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "the control socket cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let commands = commands.clone();
        tokio::spawn(async move {
            if let Err(e) = answer_one(stream, commands, owner_uid).await {
                tracing::debug!(error = %e, "a control connection ended early");
            }
            drop(permit);
        });
    }
}

/// Reads one request, has the supervisor apply it, writes its answer.
async fn answer_one(
    stream: UnixStream,
    commands: mpsc::WeakSender<Command>,
    owner_uid: u32,
) -> io::Result<()> {
    let peer = stream.peer_cred()?.uid();
    let (read, mut write) = stream.into_split();
    let answer = if peer != owner_uid {
        refused(&FlowError::Control {
            path: PathBuf::from("control.sock"),
            reason: format!(
                "refused a request from user {peer}: only user {owner_uid} may change this flow"
            ),
        })
    } else {
        let line = tokio::time::timeout(REQUEST_READ_TIMEOUT, read_line(read, MAX_REQUEST_BYTES))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request line in time"))??;
        let Some(line) = line else {
            // Connected and went away without asking anything.
            return Ok(());
        };
        match serde_json::from_str::<RequestLine>(&line) {
            Err(e) => refused(&protocol_error(format!("not a change request: {e}"))),
            Ok(r) if r.version != CONTROL_VERSION => refused(&protocol_error(format!(
                "request format version {} is not {CONTROL_VERSION}",
                r.version
            ))),
            Ok(r) => match apply(r.request, &commands).await {
                Ok(report) => Answer::Done(report),
                Err(e) => refused(&e),
            },
        }
    };
    let mut bytes = serde_json::to_vec(&AnswerLine {
        version: CONTROL_VERSION,
        answer,
    })
    .map_err(io::Error::other)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.shutdown().await
}

async fn apply(
    request: ChangeRequest,
    commands: &mpsc::WeakSender<Command>,
) -> Result<ChangeReport, FlowError> {
    let stopping = || FlowError::NotStarted {
        service: request.services().join(", "),
        reason: "the flow is being torn down".into(),
    };
    let Some(commands) = commands.upgrade() else {
        return Err(stopping());
    };
    let (reply, answer) = oneshot::channel();
    commands
        .send(Command::Change {
            request: request.clone(),
            reply,
        })
        .await
        .map_err(|_| stopping())?;
    drop(commands);
    answer.await.map_err(|_| stopping())?
}

fn refused(e: &FlowError) -> Answer {
    Answer::Refused {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}

fn protocol_error(reason: String) -> FlowError {
    FlowError::Control {
        path: PathBuf::from("control.sock"),
        reason,
    }
}

/// One line of at most `limit` bytes, without its newline; `None` at a clean end of stream.
async fn read_line(read: impl AsyncRead + Unpin, limit: u64) -> io::Result<Option<String>> {
    let mut reader = BufReader::new(read.take(limit + 1));
    let mut line = String::new();
    let n = reader.read_line(&mut line).await?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            if n as u64 > limit {
                format!("a line longer than {limit} bytes")
            } else {
                "the line ended without a newline".to_owned()
            },
        ));
    }
    line.pop();
    Ok(Some(line))
}

/// Asks the `up` running the workspace at `root` to apply `change`, and waits for its answer
/// (a restart or an add answers once what it started is ready). Refused with
/// `flow.not_running` when no `up` answers there.
pub async fn request(root: &Path, change: &ChangeRequest) -> Result<ChangeReport, FlowError> {
    let paths = StatePaths::for_workspace(root);
    let path = paths.control_socket.clone();
    let broken = |reason: String| FlowError::Control {
        path: path.clone(),
        reason,
    };
    let stream = match with_socket_path(&path, |p| {
        // A blocking connect to a unix socket returns at once: it is accepted into the
        // backlog or refused.
        std::os::unix::net::UnixStream::connect(p)
    }) {
        Ok(stream) => stream,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(not_running(root, &paths));
        }
        Err(e) => return Err(broken(format!("cannot connect: {e}"))),
    };
    stream
        .set_nonblocking(true)
        .map_err(|e| broken(e.to_string()))?;
    let stream = UnixStream::from_std(stream).map_err(|e| broken(e.to_string()))?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(&RequestLine {
        version: CONTROL_VERSION,
        request: change.clone(),
    })
    .map_err(|e| broken(e.to_string()))?;
    line.push(b'\n');
    write
        .write_all(&line)
        .await
        .map_err(|e| broken(format!("cannot send the request: {e}")))?;
    let answer = read_line(read, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| broken(format!("cannot read the answer: {e}")))?
        .ok_or_else(|| broken("the running `hostd flow up` closed the connection without answering (did it just stop?)".into()))?;
    let answer: AnswerLine =
        serde_json::from_str(&answer).map_err(|e| broken(format!("not an answer: {e}")))?;
    if answer.version != CONTROL_VERSION {
        return Err(broken(format!(
            "answer format version {} is not {CONTROL_VERSION}",
            answer.version
        )));
    }
    match answer.answer {
        Answer::Done(report) => Ok(report),
        Answer::Refused { code, message } => Err(FlowError::Answered { code, message }),
    }
}

/// Why nobody answers: nothing recorded, or the recorded `up` is gone (its socket file, if
/// any, is stale), or it runs but does not listen (yet).
fn not_running(root: &Path, paths: &StatePaths) -> FlowError {
    let detail = match state::read_state(paths) {
        Ok(None) => "nothing is recorded there; start a flow with `hostd flow up`".to_owned(),
        Ok(Some(recorded)) => match procfs::prove(&recorded.supervisor) {
            Ok(Ownership::Proven { .. }) => format!(
                "its `hostd flow up` (pid {}) does not answer on {}; it may still be starting",
                recorded.supervisor.pid,
                paths.control_socket.display()
            ),
            _ => format!(
                "the `hostd flow up` that started it (pid {}) is gone; `hostd flow down` stops what it left",
                recorded.supervisor.pid
            ),
        },
        Err(e) => format!("its state cannot be read: {e}"),
    };
    FlowError::NotRunning {
        workspace: root.to_path_buf(),
        detail,
    }
}
