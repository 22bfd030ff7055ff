//! The fault proxy over real sockets: an echo server and a peer whose side of the link the
//! test holds, and a real PostgreSQL connection (`sqlx`), each fault switched on and off
//! while they talk. Times are only ever checked as lower bounds (a delay cannot make a round
//! trip faster), never as speed.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use testkit::eventually;
use testkit::faultproxy::{Cut, Direction, FaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(300);

/// An echo server on loopback; returns its address and a count of the connections it accepted.
async fn echo_server() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, accepted)
}

/// A server whose accepted sockets the test holds itself (to see what reaches the upstream).
struct Peers {
    addr: SocketAddr,
    accepted: tokio::sync::mpsc::Receiver<TcpStream>,
}

impl Peers {
    async fn start() -> Peers {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, accepted) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                if tx.send(s).await.is_err() {
                    break;
                }
            }
        });
        Peers { addr, accepted }
    }

    async fn next(&mut self) -> TcpStream {
        tokio::time::timeout(Duration::from_secs(5), self.accepted.recv())
            .await
            .expect("the upstream sees the connection")
            .expect("the peer server runs")
    }
}

/// Reads exactly `n` bytes, within 10 s.
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut buf))
        .await
        .expect("the bytes arrive")
        .expect("the read succeeds");
    buf
}

/// True when nothing at all (no byte, no end, no error) arrives within [`QUIET`].
async fn silent(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    tokio::time::timeout(QUIET, s.read(&mut buf)).await.is_err()
}

/// What the next read gives: `Ok(0)` for an end of stream, or its error kind.
async fn ending(s: &mut TcpStream) -> Result<usize, ErrorKind> {
    let mut buf = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the connection ends within 5 s")
        .map_err(|e| e.kind())
}

/// Dials `addr` and reads until the connection ends: a reset may already fail the connect
/// itself (the proxy can reset the socket before the client's connect call returns).
async fn dial_and_end(addr: SocketAddr) -> Result<usize, ErrorKind> {
    match TcpStream::connect(addr).await {
        Ok(mut s) => ending(&mut s).await,
        Err(e) => Err(e.kind()),
    }
}

async fn round_trip(s: &mut TcpStream, bytes: &[u8]) -> Duration {
    let started = Instant::now();
    s.write_all(bytes).await.unwrap();
    assert_eq!(read_n(s, bytes.len()).await, bytes);
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pass_both_ways_unchanged_and_are_counted() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let handle = proxy.handle();
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    let sent: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let (mut r, mut w) = c.split();
    let writing = async {
        w.write_all(&sent).await.unwrap();
    };
    let mut got = vec![0u8; sent.len()];
    let reading = async {
        r.read_exact(&mut got).await.unwrap();
    };
    tokio::join!(writing, reading);
    assert!(got == sent, "the bytes came back unchanged");
    let stats = handle.stats();
    assert_eq!(stats.accepted, 1);
    assert_eq!(stats.bytes_up, sent.len() as u64);
    assert_eq!(stats.bytes_down, sent.len() as u64);
    assert_eq!(stats.open, 1);
    drop(c);
    eventually("the closed connection to be counted out", async || {
        let open = handle.stats().open;
        testkit::check(open == 0, || format!("{open} open"))
    })
    .await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_holds_back_each_direction_it_is_set_on() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let link = proxy.handle();
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut c, b"warm").await;
    let delay = Duration::from_millis(150);
    link.delay(Direction::Up, delay, Duration::ZERO);
    let rtt = round_trip(&mut c, b"up").await;
    assert!(rtt >= delay, "delayed up: {rtt:?}");
    link.delay(Direction::Both, delay, Duration::ZERO);
    let rtt = round_trip(&mut c, b"both").await;
    assert!(rtt >= delay * 2, "delayed both ways: {rtt:?}");
    link.heal();
    assert!(link.faults().is_pass());
    round_trip(&mut c, b"healed").await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jittered_chunks_arrive_in_the_order_they_were_sent() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    proxy.handle().delay(
        Direction::Both,
        Duration::from_millis(2),
        Duration::from_millis(30),
    );
    let c = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut r, mut w) = c.into_split();
    let messages = 200u32;
    let writer = tokio::spawn(async move {
        for i in 0..messages {
            // Separate writes a millisecond apart: separate chunks with their own jitter.
            w.write_all(&i.to_be_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        w
    });
    let mut got = vec![0u8; messages as usize * 4];
    tokio::time::timeout(Duration::from_secs(20), r.read_exact(&mut got))
        .await
        .expect("every message comes back")
        .unwrap();
    let order: Vec<u32> = got
        .chunks(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(order, (0..messages).collect::<Vec<_>>());
    drop(writer.await.unwrap());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bandwidth_limit_caps_the_bytes_a_second() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut c, b"warm").await;
    proxy.handle().bandwidth(Direction::Up, Some(40_000));
    // 40 KiB at 40,000 B/s: a little over a second, however fast the machine.
    let rtt = round_trip(&mut c, &[7u8; 40 * 1024]).await;
    assert!(rtt >= Duration::from_millis(900), "{rtt:?}");
    proxy.handle().bandwidth(Direction::Up, None);
    assert!(proxy.handle().faults().is_pass());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_new_connections_resets_or_closes_them_at_accept_and_spares_open_ones() {
    let (echo, accepted) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let link = proxy.handle();
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut open, b"before").await;

    link.drop_new(Cut::Reset);
    assert_eq!(
        dial_and_end(proxy.addr()).await,
        Err(ErrorKind::ConnectionReset)
    );
    link.drop_new(Cut::Close);
    assert_eq!(dial_and_end(proxy.addr()).await, Ok(0));
    round_trip(&mut open, b"still open").await;
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no dropped connection reached the upstream"
    );

    link.heal();
    let mut later = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut later, b"after").await;
    let stats = link.stats();
    assert_eq!((stats.accepted, stats.dropped), (4, 2));
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_holds_new_connections_silent_and_open_ones_quiet_until_it_heals() {
    let (echo, accepted) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let link = proxy.handle();
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut open, b"before").await;

    link.black_hole();
    open.write_all(b"lost?").await.unwrap();
    assert!(silent(&mut open).await, "an open connection goes quiet");
    let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
    held.write_all(b"hello?").await.unwrap();
    assert!(
        silent(&mut held).await,
        "a new one is accepted, never answered, never closed"
    );
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a held connection is not dialled through"
    );
    assert_eq!(link.stats().held, 1);

    // Healed: what was held is delivered, nothing was lost.
    link.heal();
    assert_eq!(read_n(&mut open, 5).await, b"lost?");
    assert_eq!(read_n(&mut held, 6).await, b"hello?");
    round_trip(&mut held, b"and on").await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_all_connections_ends_both_sides_of_each_and_spares_later_ones() {
    let mut peers = Peers::start().await;
    let proxy = FaultProxy::start(peers.addr).await.unwrap();
    let link = proxy.handle();

    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut server = peers.next().await;
    client.write_all(b"hi").await.unwrap();
    assert_eq!(read_n(&mut server, 2).await, b"hi");
    link.cut_all(Cut::Reset);
    assert_eq!(ending(&mut client).await, Err(ErrorKind::ConnectionReset));
    assert_eq!(ending(&mut server).await, Err(ErrorKind::ConnectionReset));

    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut server = peers.next().await;
    server.write_all(b"born after").await.unwrap();
    assert_eq!(read_n(&mut client, 10).await, b"born after");
    link.cut_all(Cut::Close);
    assert_eq!(ending(&mut client).await, Ok(0));
    assert_eq!(ending(&mut server).await, Ok(0));

    // A cut held connection is ended too.
    link.black_hole();
    let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
    eventually("the connection to be held", async || {
        let held = link.stats().held;
        testkit::check(held == 1, || format!("{held} held"))
    })
    .await;
    link.cut_all(Cut::Reset);
    assert_eq!(ending(&mut held).await, Err(ErrorKind::ConnectionReset));
    assert_eq!(link.stats().cut, 3);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_link_stops_one_direction_while_the_other_flows() {
    let mut peers = Peers::start().await;
    let proxy = FaultProxy::start(peers.addr).await.unwrap();
    let link = proxy.handle();
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut server = peers.next().await;

    link.half_open(Direction::Up);
    client.write_all(b"ping").await.unwrap();
    assert!(silent(&mut server).await, "client to upstream is stopped");
    server.write_all(b"pong").await.unwrap();
    assert_eq!(read_n(&mut client, 4).await, b"pong", "the other way flows");
    link.heal();
    assert_eq!(read_n(&mut server, 4).await, b"ping", "held, not lost");

    link.half_open(Direction::Down);
    server.write_all(b"down").await.unwrap();
    assert!(silent(&mut client).await, "upstream to client is stopped");
    client.write_all(b"up").await.unwrap();
    assert_eq!(read_n(&mut server, 2).await, b"up", "the other way flows");
    link.heal();
    assert_eq!(read_n(&mut client, 4).await, b"down", "held, not lost");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_resets_the_client_and_the_proxy_keeps_serving() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let link = proxy.handle();
    // A port nothing listens on: released at once, on an address of its own (so neither the
    // proxy itself nor another test's server can be given it on 127.0.0.1).
    let nothing = {
        let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap()
    };
    link.set_upstream(nothing);
    assert_eq!(
        dial_and_end(proxy.addr()).await,
        Err(ErrorKind::ConnectionReset)
    );
    assert_eq!(link.stats().upstream_failed, 1);

    link.set_upstream(echo);
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut c, b"served").await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_every_connection_held_or_stalled_and_stops_accepting() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let link = proxy.handle();
    let addr = proxy.addr();
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    round_trip(&mut stalled, b"x").await;
    link.black_hole();
    stalled.write_all(b"held").await.unwrap();
    let mut held = TcpStream::connect(addr).await.unwrap();
    eventually("the connection to be held", async || {
        let held = link.stats().held;
        testkit::check(held == 1, || format!("{held} held"))
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), proxy.shutdown())
        .await
        .expect("shutdown waits for nothing that cannot end");
    // Ended, each: an end of stream, or a reset where the proxy closed with bytes unread.
    for c in [&mut stalled, &mut held] {
        let end = ending(c).await;
        assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    }
    assert_eq!(link.stats().open, 0);
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "nothing listens any more"
    );
    // A handle that outlived its proxy changes nothing and does not panic.
    link.cut_all(Cut::Reset);
    link.heal();
}

/// The PostgreSQL server of `HOST_TEST_DATABASE_URL`, as connect options and its address.
fn postgres() -> Option<(sqlx::postgres::PgConnectOptions, SocketAddr)> {
    let url = sessionstore::testing::postgres_url()?;
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    let host = match options.get_host() {
        "localhost" => "127.0.0.1",
        h => h,
    };
    let addr = format!("{host}:{}", options.get_port())
        .parse()
        .expect("the test server is on an IP address");
    Some((options, addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_connection_through_the_proxy_answers_and_feels_every_fault() {
    use sqlx::Connection;
    let Some((options, server)) = postgres() else {
        return;
    };
    let proxy = FaultProxy::start(server).await.unwrap();
    let link = proxy.handle();
    let through = options.host("127.0.0.1").port(proxy.addr().port());
    let mut conn = sqlx::PgConnection::connect_with(&through).await.unwrap();
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);

    // Delayed both ways: a query's round trip cannot beat twice the delay.
    link.delay(Direction::Both, Duration::from_millis(100), Duration::ZERO);
    let started = Instant::now();
    sqlx::query("select 1").execute(&mut conn).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    link.heal();

    // Black hole and half-open: the query hangs (nothing fails), then completes once healed,
    // on the same connection.
    for fault in ["black hole", "half-open up", "half-open down"] {
        match fault {
            "black hole" => link.black_hole(),
            "half-open up" => link.half_open(Direction::Up),
            _ => link.half_open(Direction::Down),
        }
        let pending = tokio::spawn(async move {
            let r: Result<i32, sqlx::Error> =
                sqlx::query_scalar("select 2").fetch_one(&mut conn).await;
            (r, conn)
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!pending.is_finished(), "{fault}: the query waits");
        link.heal();
        let (r, back) = tokio::time::timeout(Duration::from_secs(10), pending)
            .await
            .expect("healed: the query completes")
            .unwrap();
        assert_eq!(r.unwrap(), 2, "{fault}");
        conn = back;
    }

    // Cut: the open connection fails; a new one works.
    link.cut_all(Cut::Reset);
    let cut = sqlx::query("select 3").execute(&mut conn).await;
    assert!(cut.is_err(), "a reset connection fails: {cut:?}");
    let mut again = sqlx::PgConnection::connect_with(&through).await.unwrap();
    sqlx::query("select 4").execute(&mut again).await.unwrap();

    // New connections dropped: connecting fails; the open one is spared.
    link.drop_new(Cut::Reset);
    assert!(sqlx::PgConnection::connect_with(&through).await.is_err());
    sqlx::query("select 5").execute(&mut again).await.unwrap();
    link.heal();
    let mut last = sqlx::PgConnection::connect_with(&through).await.unwrap();
    sqlx::query("select 6").execute(&mut last).await.unwrap();
    let stats = link.stats();
    assert!(stats.cut >= 1 && stats.dropped == 1, "{stats:?}");
    assert!(stats.bytes_up > 0 && stats.bytes_down > 0);
    drop((again, last, conn));
    proxy.shutdown().await;
}
