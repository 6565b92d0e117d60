//! Console sessions: a token typed once becomes an HttpOnly cookie naming a session held here,
//! in a bounded map, each for [`SESSION_LIFETIME`]; sign-in attempts are rate-limited.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How long a sign-in lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once; a new one past this pushes out the one that ends first.
pub const MAX_SESSIONS: usize = 256;
/// Failed sign-ins allowed per [`SIGN_IN_WINDOW`], from everyone together: a guesser gets a
/// handful of tries a minute, against a token of 128 bits or more.
pub const SIGN_IN_FAILURES: usize = 10;
pub const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);

/// What a session may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Signed in with the read token: looks only.
    Reader,
    /// Signed in with the operator token: may act where `console_actions` is on.
    Operator,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
        }
    }
}

/// A live session: its role, the name it signed in as (a named token's), when it ends.
type Live = (Role, Option<String>, Instant);

#[derive(Default)]
pub struct Sessions {
    /// By the SHA-256 of the cookie's value: the map holds no usable secret.
    live: Mutex<HashMap<[u8; 32], Live>>,
    failures: Mutex<Vec<Instant>>,
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// 32 bytes from the kernel's CSPRNG, as hex.
fn new_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

impl Sessions {
    /// Starts a session of `role`, signed in as `name` where the token has one; its id, for
    /// the cookie.
    pub fn start(&self, role: Role, name: Option<&str>) -> std::io::Result<String> {
        let id = new_id()?;
        let now = Instant::now();
        let mut live = self.live.lock().expect("not poisoned");
        live.retain(|_, (_, _, ends)| *ends > now);
        if live.len() >= MAX_SESSIONS {
            if let Some(first_to_end) = live
                .iter()
                .min_by_key(|(_, (_, _, ends))| *ends)
                .map(|(k, _)| *k)
            {
                live.remove(&first_to_end);
            }
        }
        live.insert(
            key(&id),
            (role, name.map(str::to_owned), now + SESSION_LIFETIME),
        );
        Ok(id)
    }

    /// The role of a live session, and the name it signed in as.
    pub fn session(&self, id: &str) -> Option<(Role, Option<String>)> {
        let live = self.live.lock().expect("not poisoned");
        live.get(&key(id))
            .filter(|(_, _, ends)| *ends > Instant::now())
            .map(|(role, name, _)| (*role, name.clone()))
    }

    pub fn end(&self, id: &str) {
        self.live.lock().expect("not poisoned").remove(&key(id));
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.live.lock().expect("not poisoned").len()
    }

    /// Whether a sign-in may be tried now (fewer than [`SIGN_IN_FAILURES`] failed lately).
    pub fn may_try(&self) -> bool {
        let mut failures = self.failures.lock().expect("not poisoned");
        failures.retain(|at| at.elapsed() < SIGN_IN_WINDOW);
        failures.len() < SIGN_IN_FAILURES
    }

    pub fn failed(&self) {
        let mut failures = self.failures.lock().expect("not poisoned");
        if failures.len() < SIGN_IN_FAILURES {
            failures.push(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_and_sign_ins_limited() {
        let sessions = Sessions::default();
        let first = sessions.start(Role::Reader, Some("alice")).unwrap();
        assert_eq!(
            sessions.session(&first),
            Some((Role::Reader, Some("alice".to_owned())))
        );
        assert_eq!(sessions.session("forged"), None);
        for _ in 0..MAX_SESSIONS + 10 {
            sessions.start(Role::Operator, None).unwrap();
        }
        assert_eq!(sessions.count(), MAX_SESSIONS);
        assert_eq!(
            sessions.session(&first),
            None,
            "the first to end was pushed out"
        );
        let last = sessions.start(Role::Operator, None).unwrap();
        sessions.end(&last);
        assert_eq!(sessions.session(&last), None);
        for _ in 0..SIGN_IN_FAILURES {
            assert!(sessions.may_try());
            sessions.failed();
        }
        assert!(!sessions.may_try());
    }
}
