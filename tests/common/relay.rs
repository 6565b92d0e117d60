//! A TCP relay to a PostgreSQL server that the test can cut, as a stop, a restart or a failover does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP relay to the PostgreSQL server that can fail like it: [`Relay::cut`] drops every
/// open connection mid-stream and refuses new ones, as a server restart or a failover does,
/// until [`Relay::restore`].
pub struct Relay {
    pub port: u16,
    up: Arc<AtomicBool>,
    /// Bumped at each cut: connections of an earlier generation end.
    generation: watch::Sender<u64>,
}

impl Relay {
    pub async fn start(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let relay = Relay {
            port,
            up: up.clone(),
            generation: generation.clone(),
        };
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if !up.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused, in effect
                }
                let mut cut = generation.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        relay
    }

    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|generation| *generation += 1);
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// host:port of the server in a database URL (as [`super::new_postgres_database`] writes it).
pub fn server_of(database_url: &str) -> String {
    let config: postgres::Config = database_url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the test server must be reached over TCP, not {other:?}"),
    };
    format!("{host}:{}", config.get_ports().first().unwrap_or(&5432))
}
