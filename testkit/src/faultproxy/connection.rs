//! One proxied connection, from accept to close: held while the accept fault black-holes,
//! then dialled to the upstream and pumped both ways under the faults in force, until both
//! directions end, either side fails, a cut is ordered or the proxy stops. Owns both sockets
//! and how they are closed; never panics on an I/O error.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;

use super::settings::{AcceptFault, Cut, Direction, Faults};
use super::stats::{Counters, OpenGuard};
use super::{Control, Shared};

/// How long the proxy waits for its upstream to accept a dial.
const UPSTREAM_CONNECT: Duration = Duration::from_secs(5);

/// Closes a socket the way `how` says.
pub(super) fn close(socket: TcpStream, how: Cut) {
    if how == Cut::Reset {
        // Ignored on failure: the socket is closed either way, only less abruptly.
        let _ = socket.set_zero_linger();
    }
    drop(socket);
}

/// Why a connection ended other than by both directions finishing.
enum Ending {
    Done,
    Failed,
    Cut(Cut),
    Stopping,
}

/// A cut ordered after this connection was born, or the proxy stopping.
fn ordered(control: &Control, born: u64) -> Option<Ending> {
    if control.stopping {
        Some(Ending::Stopping)
    } else if control.cuts > born {
        Some(Ending::Cut(control.last_cut))
    } else {
        None
    }
}

/// Serves one accepted client socket until it ends.
pub(super) async fn serve(client: TcpStream, shared: Arc<Shared>, born: u64) {
    let _open = OpenGuard::new(&shared.stats.open);
    let mut faults = shared.faults.subscribe();
    let mut control = shared.control.subscribe();
    let _ = client.set_nodelay(true);

    // Held silent while the black hole lasts.
    if faults.borrow_and_update().accept == AcceptFault::BlackHole {
        Counters::bump(&shared.stats.held);
        loop {
            tokio::select! {
                changed = faults.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if faults.borrow_and_update().accept != AcceptFault::BlackHole {
                        break;
                    }
                }
                changed = control.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    match ordered(&control.borrow_and_update(), born) {
                        Some(Ending::Cut(how)) => {
                            Counters::bump(&shared.stats.cut);
                            close(client, how);
                            return;
                        }
                        Some(_) => {
                            close(client, Cut::Close);
                            return;
                        }
                        None => {}
                    }
                }
            }
        }
    }

    let upstream_addr = shared.upstream();
    let upstream =
        match tokio::time::timeout(UPSTREAM_CONNECT, TcpStream::connect(upstream_addr)).await {
            Ok(Ok(s)) => s,
            _ => {
                // What a client would see dialling a dead address: a reset.
                Counters::bump(&shared.stats.upstream_failed);
                close(client, Cut::Reset);
                return;
            }
        };
    let _ = upstream.set_nodelay(true);
    let (mut client, mut upstream) = (client, upstream);
    let ending = pump_both(
        &mut client,
        &mut upstream,
        &shared,
        faults,
        &mut control,
        born,
    )
    .await;
    match ending {
        Ending::Done => {}
        Ending::Failed => {
            // One side failed: the other learns at once rather than waiting on a dead peer.
            close(client, Cut::Reset);
            close(upstream, Cut::Reset);
        }
        Ending::Cut(how) => {
            Counters::bump(&shared.stats.cut);
            close(client, how);
            close(upstream, how);
        }
        Ending::Stopping => {
            close(client, Cut::Close);
            close(upstream, Cut::Close);
        }
    }
}

async fn pump_both(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    shared: &Shared,
    faults: watch::Receiver<Faults>,
    control: &mut watch::Receiver<Control>,
    born: u64,
) -> Ending {
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    let up = super::pump::run(
        client_read,
        upstream_write,
        Direction::Up,
        faults.clone(),
        &shared.stats.bytes_up,
    );
    let down = super::pump::run(
        upstream_read,
        client_write,
        Direction::Down,
        faults,
        &shared.stats.bytes_down,
    );
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    if let Some(e) = ordered(&control.borrow_and_update(), born) {
        return e;
    }
    loop {
        tokio::select! {
            r = &mut up, if !up_done => match r {
                Ok(()) => up_done = true,
                Err(_) => return Ending::Failed,
            },
            r = &mut down, if !down_done => match r {
                Ok(()) => down_done = true,
                Err(_) => return Ending::Failed,
            },
            changed = control.changed() => {
                if changed.is_err() {
                    return Ending::Stopping;
                }
                if let Some(e) = ordered(&control.borrow_and_update(), born) {
                    return e;
                }
            }
        }
        if up_done && down_done {
            return Ending::Done;
        }
    }
}
