//! Clients of the admin listener from a chosen loopback address (the whole of 127/8 is loopback
//! on Linux: an attacker on 127.0.0.2 and an operator on 127.0.0.1 are two peers to the
//! receiver), over raw HTTP/1.1, and the real binary they talk to.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::free_port;
use super::service::{write_config, Service};

/// The tokens of [`start`]'s receiver (each of 32 characters or more).
pub const OPERATOR_TOKEN: &str = "hostile-operator-token-0123456789abcdef";
pub const READ_TOKEN: &str = "hostile-reader-token-0123456789abcdefgh";
pub const ALICE_TOKEN: &str = "hostile-alice-token-0123456789abcdefghi";
pub const BOB_TOKEN: &str = "hostile-bob-reader-token-0123456789abcd";
/// The peers: a stranger or a token holder who attacks, and the operator.
pub const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
pub const OPERATOR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

/// The binary with an admin listener (actions on) on `admin_port`; alice is a named
/// operator, bob a named reader.
pub async fn start(dir: &Path, admin_port: u16) -> Service {
    start_with(dir, admin_port, "").await
}

/// [`start`], with more `[admin]` keys.
pub async fn start_with(dir: &Path, admin_port: u16, admin_keys: &str) -> Service {
    start_listeners(dir, admin_port, "", admin_keys).await.0
}

/// [`start_with`], with more `[server]` keys; and the webhook listener's port.
pub async fn start_listeners(
    dir: &Path,
    admin_port: u16,
    server_keys: &str,
    admin_keys: &str,
) -> (Service, u16) {
    for (file, token) in [
        ("admin_token", OPERATOR_TOKEN),
        ("read_token", READ_TOKEN),
        ("alice_token", ALICE_TOKEN),
        ("bob_token", BOB_TOKEN),
    ] {
        std::fs::write(dir.join(file), token).unwrap();
    }
    let port = free_port();
    let extra = format!(
        "[handler]\ncommand = [\"true\"]\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\
         read_token_file = \"read_token\"\nconsole_actions = true\n{admin_keys}\n\n\
         [[admin.tokens]]\nname = \"alice\"\nfile = \"alice_token\"\nrole = \"operator\"\n\n\
         [[admin.tokens]]\nname = \"bob\"\nfile = \"bob_token\"\nrole = \"reader\"\n"
    );
    let config = write_config(dir, port, server_keys, &extra);
    let service = Service::start(&config, port).await;
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", admin_port)).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no admin listener"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (service, port)
}

/// A connection to the admin listener from `from`.
pub async fn connect(from: IpAddr, admin_port: u16) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], admin_port)))
        .await
        .unwrap()
}

/// One request from `from` (a browser's same-origin headers on a POST); the status and the
/// whole answer (head and body).
pub async fn exchange(
    from: IpAddr,
    admin_port: u16,
    request_line: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = connect(from, admin_port).await;
    let host = headers
        .iter()
        .find(|(name, _)| *name == "host")
        .map_or(format!("127.0.0.1:{admin_port}"), |(_, host)| {
            (*host).to_owned()
        });
    let mut request = format!(
        "{request_line} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\
         origin: http://127.0.0.1:{admin_port}\r\nsec-fetch-site: same-origin\r\n\
         content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers.iter().filter(|(name, _)| *name != "host") {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

pub async fn sign_in(from: IpAddr, admin_port: u16, token: &str) -> (u16, Option<String>) {
    let (status, answer) = exchange(
        from,
        admin_port,
        "POST /console/sign-in",
        &[],
        &format!("token={token}"),
    )
    .await;
    let cookie = answer
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: sume_console="))
        .map(|rest| rest.split(';').next().unwrap().to_owned());
    (status, cookie)
}

pub async fn page(admin_port: u16, cookie: &str, path: &str) -> u16 {
    page_text(admin_port, cookie, path).await.0
}

/// A page the operator loads with session `cookie`: its status and the whole answer.
pub async fn page_text(admin_port: u16, cookie: &str, path: &str) -> (u16, String) {
    let cookie = format!("sume_console={cookie}");
    exchange(
        OPERATOR,
        admin_port,
        &format!("GET {path}"),
        &[("cookie", &cookie)],
        "",
    )
    .await
}

pub fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("service.log")).unwrap_or_default()
}

pub async fn api(from: IpAddr, admin_port: u16, request_line: &str, token: &str) -> (u16, String) {
    let bearer = format!("Bearer {token}");
    let (status, answer) = exchange(
        from,
        admin_port,
        request_line,
        &[("authorization", &bearer)],
        "",
    )
    .await;
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

/// The throttle's summary lines for `what` in the service's log, and the tries they count.
pub fn summaries(dir: &Path, what: &str) -> (Vec<String>, usize) {
    let lines: Vec<String> = log(dir)
        .lines()
        .filter(|line| line.contains("wrong tokens refused") && line.contains(what))
        .map(str::to_owned)
        .collect();
    let counted = lines
        .iter()
        .filter_map(|line| line.split("total=").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
        .sum();
    (lines, counted)
}
