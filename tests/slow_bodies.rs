//! Strangers holding connections with bodies nobody has vouched for (webhook bodies before
//! their HMAC, sign-in forms, CSP reports), sent slowly from many loopback addresses, against
//! the real binary on both listeners, with TLS and without: a real sender's signed deliveries,
//! an operator's pages and `/healthz` still answer, each within [`BOUND`].
//!
//! Strangers connect from 127.0.0.2 to 127.0.0.251 (the whole of 127/8 is loopback on Linux),
//! the sender and the operator from 127.0.0.1.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::peers::{start_listeners, OPERATOR, OPERATOR_TOKEN};
use common::service::Service;
use common::tls::{connector, TestCa};
use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::task::JoinSet;

/// Each answer a sender or an operator waits for during an attack.
const BOUND: Duration = Duration::from_secs(2);

/// These tests load the machine: they take turns, so one's strangers do not slow another's
/// operator.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How a stranger sends his body: `chunk` bytes every `every`.
#[derive(Clone, Copy)]
struct Pace {
    chunk: usize,
    every: Duration,
}

/// The review's attack: a byte every half second.
const TRICKLE: Pace = Pace {
    chunk: 1,
    every: Duration::from_millis(500),
};
/// 1,000 bytes a second, above the minimum rate: only shedding makes room.
const STEADY: Pace = Pace {
    chunk: 100,
    every: Duration::from_millis(100),
};

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

/// A listener as its clients see it: where, and over TLS trusting which CA.
#[derive(Clone)]
struct Door {
    address: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Door {
    async fn open(&self, from: IpAddr) -> std::io::Result<Box<dyn Stream>> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let stream = socket.connect(self.address).await?;
        Ok(match &self.tls {
            None => Box::new(stream),
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                Box::new(tls.connect(name, stream).await?)
            }
        })
    }

    fn host(&self) -> String {
        self.address.to_string()
    }

    /// One request from 127.0.0.1 on a connection of its own: the status, and how long the
    /// answer took from the connect on.
    async fn ask(&self, request: &str) -> (u16, Duration, String) {
        let started = Instant::now();
        let Ok(mut stream) = self.open(OPERATOR).await else {
            return (0, started.elapsed(), String::new());
        };
        let mut answer = Vec::new();
        if stream.write_all(request.as_bytes()).await.is_ok() {
            // Up to the close (a TLS peer may end without close_notify: what came counts).
            let read = tokio::time::timeout(Duration::from_secs(20), async {
                let mut buffer = [0u8; 4096];
                while let Ok(read @ 1..) = stream.read(&mut buffer).await {
                    answer.extend_from_slice(&buffer[..read]);
                }
            });
            let _ = read.await;
        }
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok());
        (status.unwrap_or(0), started.elapsed(), answer)
    }

    async fn get(&self, path: &str, headers: &str) -> (u16, Duration, String) {
        let host = self.host();
        self.ask(&format!(
            "GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n{headers}\r\n"
        ))
        .await
    }

    /// A delivery signed now with the test secret.
    async fn deliver(&self, job_id: &str) -> (u16, Duration, String) {
        let (host, body) = (self.host(), job_body(job_id));
        let mut request = format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\
             content-length: {}\r\n",
            body.len()
        );
        for (name, value) in signed_headers(&body, unix_now(), &[SECRET]) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        self.ask(&format!("{request}\r\n{body}")).await
    }

    /// A console session of the operator token.
    async fn sign_in(&self) -> String {
        let body = format!("token={OPERATOR_TOKEN}");
        let head = form_head(&self.host(), "/console/sign-in", body.len(), "");
        let (status, _, answer) = self.ask(&format!("{head}{body}")).await;
        assert_eq!(status, 303, "{answer}");
        let cookie = answer
            .lines()
            .find_map(|line| line.strip_prefix("set-cookie: "))
            .unwrap();
        cookie.split(';').next().unwrap().to_owned()
    }
}

/// The head of a browser's form post of `length` bytes, with `cookie` (a session's, or none).
fn form_head(host: &str, path: &str, length: usize, cookie: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\
         sec-fetch-site: same-origin\r\ncontent-type: application/x-www-form-urlencoded\r\n\
         content-length: {length}\r\n{cookie}\r\n"
    )
}

/// What a stranger sends: a head, then what [`Sends`] says.
struct Attack {
    door: Door,
    heads: Vec<String>,
    sends: Sends,
}

enum Sends {
    /// The body its head declares `length` bytes of, at his pace.
    Body { length: usize, pace: Pace },
    /// Nothing: the head is a whole request, sent again this long after each answer.
    Again(Duration),
}

impl Attack {
    /// Webhook bodies behind a well-formed, fresh signature header (of another body: the HMAC
    /// needs the whole body before it can tell).
    fn webhook(door: &Door, length: usize, pace: Pace) -> Attack {
        let mut head = format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: {}\r\ncontent-length: {length}\r\n",
            door.host()
        );
        for (name, value) in signed_headers("{}", unix_now(), &[SECRET]) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        Attack {
            door: door.clone(),
            heads: vec![head],
            sends: Sends::Body { length, pace },
        }
    }

    /// Sign-in forms and CSP reports, in turn.
    fn console(door: &Door, length: usize, pace: Pace) -> Attack {
        let heads = ["/console/sign-in", "/console/csp-report"]
            .iter()
            .map(|path| form_head(&door.host(), path, length, ""))
            .collect();
        Attack {
            door: door.clone(),
            heads,
            sends: Sends::Body { length, pace },
        }
    }

    /// `GET /healthz` (no body, nothing to vouch for it) again `every` after each answer, on a
    /// kept-alive connection.
    fn asking_again(door: &Door, every: Duration) -> Attack {
        let head = format!("GET /healthz HTTP/1.1\r\nhost: {}\r\n\r\n", door.host());
        Attack {
            door: door.clone(),
            heads: vec![head],
            sends: Sends::Again(every),
        }
    }

    /// `count` strangers, each from the next of 250 addresses, each reconnecting as soon as
    /// its connection ends.
    fn launch(self, count: usize, strangers: &mut JoinSet<()>) {
        let attack = Arc::new(self);
        for n in 0..count {
            let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (n % 250) as u8));
            let attack = attack.clone();
            strangers.spawn(async move {
                let head = &attack.heads[n % attack.heads.len()];
                loop {
                    match attack.door.open(from).await {
                        Ok(stream) => attack.hold(stream, head).await,
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            });
        }
    }

    /// Sends the head, then what the attack sends, until the receiver answers (a body) or
    /// closes.
    async fn hold(&self, mut stream: Box<dyn Stream>, head: &str) {
        let mut buffer = [0u8; 512];
        let (length, pace) = match self.sends {
            Sends::Body { length, pace } => (length, pace),
            Sends::Again(every) => loop {
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                if matches!(stream.read(&mut buffer).await, Ok(0) | Err(_)) {
                    return;
                }
                tokio::time::sleep(every).await;
            },
        };
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; pace.chunk];
        let mut sent = 0;
        while sent + chunk.len() < length {
            tokio::select! {
                _ = stream.read(&mut buffer) => return,
                () = tokio::time::sleep(pace.every) => {}
            }
            if stream.write_all(&chunk).await.is_err() {
                return;
            }
            sent += chunk.len();
        }
        let _ = stream.read(&mut buffer).await;
    }
}

/// Whether the receiver closed (or reset) `stream` within `within`.
async fn closed(stream: &mut Box<dyn Stream>, within: Duration) -> bool {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(within, stream.read(&mut byte)).await;
    matches!(read, Ok(Ok(0) | Err(_)))
}

/// Room for `connections` more descriptors in this process: the soft limit raised to the hard
/// one where it is lower (a CI runner's 1,024).
fn raise_open_files_limit(connections: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    assert!(
        limit.rlim_cur >= connections + 256,
        "the hard open-files limit {} is too low for {connections} connections",
        limit.rlim_cur
    );
}

/// The binary with both listeners, over TLS when `ca` is given; its webhook and admin doors.
async fn start(
    dir: &std::path::Path,
    server_keys: &str,
    ca: Option<&TestCa>,
) -> (Service, Door, Door) {
    let admin_port = free_port();
    let (mut server_keys, mut admin_keys) = (server_keys.to_owned(), String::new());
    let mut tls = None;
    if let Some(ca) = ca {
        ca.leaf().install(dir);
        server_keys.push_str(&format!("\n{}", common::tls::server_tls(dir)));
        admin_keys = format!(
            "[admin.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            dir.join("cert.pem").display(),
            dir.join("key.pem").display()
        );
        tls = Some(connector(&ca.pem));
    }
    let (service, port) = start_listeners(dir, admin_port, &server_keys, &admin_keys).await;
    let door = |port| Door {
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        tls: tls.clone(),
    };
    (service, door(port), door(admin_port))
}

/// Who must get in while strangers hold on: a sender (signed deliveries and `/healthz` on the
/// webhook listener), an operator (a signed-in page, the API with a bearer token and
/// `/healthz` on the admin listener, with the session's cookie).
struct Everyone<'a> {
    webhook: Option<&'a Door>,
    admin: Option<(&'a Door, &'a str)>,
}

impl Everyone<'_> {
    /// Five rounds of each request; every one answers `200` within [`BOUND`]. The slowest of
    /// each, for the log.
    async fn get_in(&self, label: &str) {
        let mut slowest: Vec<(&str, Duration)> = Vec::new();
        for round in 0..5 {
            let mut answers = Vec::new();
            if let Some(webhook) = self.webhook {
                let job_id = format!("{}-{round}", label.replace(' ', "-"));
                answers.push(("delivery", webhook.deliver(&job_id).await));
                answers.push(("webhook /healthz", webhook.get("/healthz", "").await));
            }
            if let Some((admin, cookie)) = self.admin {
                let cookie = format!("cookie: {cookie}\r\n");
                let bearer = format!("authorization: Bearer {OPERATOR_TOKEN}\r\n");
                answers.push(("page", admin.get("/console/", &cookie).await));
                answers.push(("API", admin.get("/v1/dispatch", &bearer).await));
                answers.push(("admin /healthz", admin.get("/healthz", "").await));
            }
            for (n, (what, (status, took, answer))) in answers.into_iter().enumerate() {
                assert_eq!(
                    status, 200,
                    "{label}, round {round}: {what} after {took:?}: {answer}"
                );
                assert!(took < BOUND, "{label}, round {round}: {what} took {took:?}");
                match slowest.get_mut(n) {
                    Some((_, slowest)) => *slowest = (*slowest).max(took),
                    None => slowest.push((what, took)),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("{label}: slowest {slowest:?}");
    }
}

/// Which listeners strangers attack, at what pace, how many, with which `[server]` keys.
struct Siege {
    server_keys: &'static str,
    tls: bool,
    strangers: usize,
    /// Webhook bodies: their declared length and pace.
    bodies: Option<(usize, Pace)>,
    /// Sign-in forms and CSP reports: their declared length and pace.
    forms: Option<(usize, Pace)>,
    /// `GET /healthz` on both listeners, again this long after each answer.
    asking: Option<Duration>,
}

impl Siege {
    /// `strangers` per listener attacked, against the binary with `server_keys`.
    fn of(strangers: usize, server_keys: &'static str) -> Siege {
        Siege {
            server_keys,
            tls: false,
            strangers,
            bodies: None,
            forms: None,
            asking: None,
        }
    }

    fn over_tls(self) -> Siege {
        Siege { tls: true, ..self }
    }

    fn bodies(self, length: usize, pace: Pace) -> Siege {
        let bodies = Some((length, pace));
        Siege { bodies, ..self }
    }

    fn forms(self, length: usize, pace: Pace) -> Siege {
        let forms = Some((length, pace));
        Siege { forms, ..self }
    }

    fn asking_again(self, every: Duration) -> Siege {
        let asking = Some(every);
        Siege { asking, ..self }
    }

    /// Starts the binary, lets the strangers take their slots, then the sender (where bodies
    /// are attacked) and the operator (where forms are) must [`Everyone::get_in`].
    async fn hold(self, label: &str) {
        let _turn = ONE_AT_A_TIME.lock().await;
        raise_open_files_limit(self.strangers as u64);
        let dir = tempfile::tempdir().unwrap();
        let ca = self.tls.then(TestCa::new);
        let (service, webhook, admin) = start(dir.path(), self.server_keys, ca.as_ref()).await;
        let cookie = admin.sign_in().await;
        let mut strangers = JoinSet::new();
        if let Some((length, pace)) = self.bodies {
            Attack::webhook(&webhook, length, pace).launch(self.strangers, &mut strangers);
        }
        if let Some((length, pace)) = self.forms {
            Attack::console(&admin, length, pace).launch(self.strangers, &mut strangers);
        }
        if let Some(every) = self.asking {
            for door in [&webhook, &admin] {
                Attack::asking_again(door, every).launch(self.strangers, &mut strangers);
            }
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let everyone = Everyone {
            webhook: (self.bodies.is_some() || self.asking.is_some()).then_some(&webhook),
            admin: (self.forms.is_some() || self.asking.is_some())
                .then_some((&admin, cookie.as_str())),
        };
        everyone.get_in(label).await;
        strangers.abort_all();
        service.stop_cleanly().await;
    }
}

/// The review's measure: 120 strangers per listener, a byte every half second, against
/// `max_connections = 64` (before: 2 of 5 deliveries within 2 s, 16 of 30 pages and
/// `/healthz`).
#[tokio::test(flavor = "multi_thread")]
async fn trickled_bodies_past_the_limit_keep_no_one_out() {
    Siege::of(120, "max_connections = 64\n")
        .bodies(200, TRICKLE)
        .forms(200, TRICKLE)
        .hold("trickle")
        .await;
}

/// Regression (a review of the shedding): each answer restarted its connection's grace, so
/// strangers asking for `/healthz` more often than the grace, each on a kept-alive connection,
/// were never shed and held every slot without anything vouching for them.
#[tokio::test(flavor = "multi_thread")]
async fn strangers_asking_again_and_again_past_the_limit_keep_no_one_out() {
    Siege::of(120, "max_connections = 64\n")
        .asking_again(Duration::from_millis(200))
        .hold("asking again")
        .await;
}

/// Over TLS, webhook bodies above the minimum rate that would each hold their slot for the
/// whole minute of `body_read_timeout`: only shedding lets the sender in.
#[tokio::test(flavor = "multi_thread")]
async fn steady_bodies_past_the_limit_are_shed_over_tls() {
    Siege::of(120, "max_connections = 64\nbody_read_timeout = \"60s\"\n")
        .over_tls()
        .bodies(60_000, STEADY)
        .hold("steady bodies over TLS")
        .await;
}

/// The same on the admin listener over TLS: forms and CSP reports at 1,000 bytes a second,
/// each held up to the form's 2 s deadline but for the shedding.
#[tokio::test(flavor = "multi_thread")]
async fn steady_forms_past_the_limit_are_shed_over_tls() {
    Siege::of(120, "max_connections = 64\n")
        .over_tls()
        .forms(8000, STEADY)
        .hold("steady forms over TLS")
        .await;
}

/// 1,100 strangers' webhook bodies against the default 1,024 connections.
#[tokio::test(flavor = "multi_thread")]
async fn eleven_hundred_slow_bodies_against_the_default_limit() {
    Siege::of(1100, "")
        .bodies(200, TRICKLE)
        .hold("1,100 slow bodies")
        .await;
}

/// 1,100 strangers' slow forms against the default 1,024 connections of the admin listener
/// (before: 19 of 19 `/healthz` failed).
#[tokio::test(flavor = "multi_thread")]
async fn eleven_hundred_slow_forms_against_the_default_limit() {
    Siege::of(1100, "")
        .forms(200, TRICKLE)
        .hold("1,100 slow forms")
        .await;
}

/// A signed-in operator's action form, sent at 1,000 bytes a second for 1.5 s while strangers'
/// forms churn through every slot of the admin listener: its live session keeps its slot, and
/// it is answered, never shed.
#[tokio::test(flavor = "multi_thread")]
async fn an_operators_slow_form_keeps_its_slot() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (service, _, admin) = start(dir.path(), "max_connections = 64\n", None).await;
    let cookie = format!("cookie: {}\r\n", admin.sign_in().await);
    let mut strangers = JoinSet::new();
    Attack::console(&admin, 8000, STEADY).launch(120, &mut strangers);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let body = format!("reason=slow&pad={}", "x".repeat(1500 - 16));
    let head = form_head(
        &admin.host(),
        "/console/dispatch/pause",
        body.len(),
        &cookie,
    );
    let mut stream = admin.open(OPERATOR).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.as_bytes().chunks(STEADY.chunk) {
        tokio::time::sleep(STEADY.every).await;
        stream
            .write_all(chunk)
            .await
            .expect("the form's connection was kept");
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("Dispatch paused"), "{answer}");
    strangers.abort_all();
    service.stop_cleanly().await;
}

/// Regression: a body a byte every half second held its connection until `body_read_timeout`.
/// It is answered `408` once it falls behind the minimum rate, after its first second.
#[tokio::test(flavor = "multi_thread")]
async fn a_trickled_body_is_cut_off_after_its_first_second() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (service, webhook, _) = start(dir.path(), "body_read_timeout = \"60s\"\n", None).await;
    let attack = Attack::webhook(&webhook, 200, TRICKLE);
    let mut stream = webhook.open(OPERATOR).await.unwrap();
    stream.write_all(attack.heads[0].as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = [0u8; 12];
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            tokio::select! {
                read = stream.read_exact(&mut answer) => return read.is_ok(),
                () = tokio::time::sleep(TRICKLE.every) => {
                    if stream.write_all(b"x").await.is_err() {
                        return false;
                    }
                }
            }
        }
    })
    .await;
    let took = started.elapsed();
    assert_eq!(answered, Ok(true), "no answer within 10 s");
    assert_eq!(
        &answer,
        b"HTTP/1.1 408",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        took >= Duration::from_secs(1),
        "cut off in its first second: {took:?}"
    );
    service.stop_cleanly().await;
}

/// Past its share of `max_connections` (8 of 64), an address's (here 127.0.0.2's) new
/// connection takes the place of its own oldest one that nobody vouched for, never another
/// peer's; a burst of young connections is left its grace.
#[tokio::test(flavor = "multi_thread")]
async fn past_its_share_an_address_pushes_out_its_own_connections() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = "max_connections = 64\nheader_read_timeout = \"60s\"\n";
    let (service, webhook, _) = start(dir.path(), keys, None).await;
    let slow_head = format!("POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\nx-slow: a");
    let open = |from: IpAddr| {
        let (webhook, slow_head) = (webhook.clone(), slow_head.clone());
        async move {
            let mut stream = webhook.open(from).await.unwrap();
            stream.write_all(slow_head.as_bytes()).await.unwrap();
            stream
        }
    };
    let mut elsewhere = open(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3))).await;
    let stranger = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut burst = Vec::new();
    for _ in 0..20 {
        burst.push(open(stranger).await);
    }
    // Past the grace: 10 more push out the burst's 10 oldest.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut more = Vec::new();
    for _ in 0..10 {
        more.push(open(stranger).await);
    }
    assert!(
        closed(&mut burst[9], Duration::from_secs(5)).await,
        "the 10th oldest"
    );
    let mut pushed_out = 0;
    for stream in &mut burst {
        if closed(stream, Duration::from_millis(20)).await {
            pushed_out += 1;
        }
    }
    assert_eq!(
        pushed_out, 10,
        "the burst's oldest were pushed out, only they"
    );
    assert!(
        !closed(&mut elsewhere, Duration::from_millis(200)).await,
        "another peer's"
    );
    // Half a head waits for the rest, also through a shutdown: the test ends them.
    drop((burst, more, elsewhere));
    service.stop_cleanly().await;
}
