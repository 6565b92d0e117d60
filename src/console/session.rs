//! Console sessions: a token typed once becomes an HttpOnly cookie naming a session held here,
//! each for [`SESSION_LIFETIME`], at most [`SESSIONS_PER_TOKEN`] per token: a sign-in pushes
//! out its own token's oldest session, never another token's.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::header::{self, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::access::Identity;

/// How long a sign-in lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions one token holds at once (browsers, machines); the sessions held together are at
/// most this times the number of tokens, which the config bounds.
pub const SESSIONS_PER_TOKEN: usize = 32;

/// The session cookie as a request reached the console. `__Host-` where the admin listener
/// speaks TLS itself: the whole host is the console's, so the cookie is the host's (`Path=/`)
/// and neither a sibling domain nor a plain-HTTP page can plant one in its place. `__Secure-`
/// at a TLS proxy, where other sites may share the host: it stays under `/console`. No prefix
/// over plain HTTP (loopback, or `allow_plain_http`), where a browser refuses a prefixed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cookie {
    Host,
    Secure,
    Plain,
}

impl Cookie {
    fn name_and_path(self) -> (&'static str, &'static str) {
        match self {
            Cookie::Host => ("__Host-sume_console", "/"),
            Cookie::Secure => ("__Secure-sume_console", "/console"),
            Cookie::Plain => ("sume_console", "/console"),
        }
    }

    /// `Set-Cookie` for session `id`, for `lifetime` (an empty id and zero: the session's end).
    pub fn set(self, id: &str, lifetime: Duration) -> HeaderValue {
        let (name, path) = self.name_and_path();
        let secure = if self == Cookie::Plain {
            ""
        } else {
            "; Secure"
        };
        let cookie = format!(
            "{name}={id}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            lifetime.as_secs()
        );
        HeaderValue::from_str(&cookie).expect("hex and ASCII")
    }

    /// The session id the request's cookies hold under this cookie's name.
    pub fn read(self, headers: &HeaderMap) -> Option<String> {
        let prefix = format!("{}=", self.name_and_path().0);
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .find_map(|pair| pair.trim().strip_prefix(prefix.as_str()).map(str::to_owned))
    }
}

/// A live session: who signed in, when it ends.
type Live = (Identity, Instant);

#[derive(Default)]
pub struct Sessions {
    /// By the SHA-256 of the cookie's value: the map holds no usable secret.
    live: Mutex<HashMap<[u8; 32], Live>>,
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
    /// Starts a session for `who`; its id, for the cookie. Past [`SESSIONS_PER_TOKEN`], the
    /// same token's session that ends first is ended.
    pub fn start(&self, who: Identity) -> std::io::Result<String> {
        let id = new_id()?;
        let now = Instant::now();
        let token = who.token_key();
        let mut live = self.live.lock().expect("not poisoned");
        live.retain(|_, (_, ends)| *ends > now);
        let same_token = || {
            live.iter()
                .filter(|(_, (held, _))| held.token_key() == token)
        };
        if same_token().count() >= SESSIONS_PER_TOKEN {
            if let Some(first_to_end) = same_token().min_by_key(|(_, (_, ends))| *ends) {
                let first_to_end = *first_to_end.0;
                live.remove(&first_to_end);
            }
        }
        live.insert(key(&id), (who, now + SESSION_LIFETIME));
        Ok(id)
    }

    /// Who a live session signed in as.
    pub fn session(&self, id: &str) -> Option<Identity> {
        let live = self.live.lock().expect("not poisoned");
        live.get(&key(id))
            .filter(|(_, ends)| *ends > Instant::now())
            .map(|(who, _)| who.clone())
    }

    pub fn end(&self, id: &str) {
        self.live.lock().expect("not poisoned").remove(&key(id));
    }

    /// Ends every session of `who`'s token (signed in elsewhere, a lost laptop); how many.
    pub fn end_everywhere(&self, who: &Identity) -> usize {
        let token = who.token_key();
        let mut live = self.live.lock().expect("not poisoned");
        let before = live.len();
        live.retain(|_, (held, _)| held.token_key() != token);
        before - live.len()
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.live.lock().expect("not poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Role;

    fn named(role: Role, name: &str) -> Identity {
        Identity {
            role,
            name: Some(name.to_owned()),
        }
    }

    #[test]
    fn a_token_pushes_out_only_its_own_sessions() {
        let sessions = Sessions::default();
        let alice = sessions.start(named(Role::Operator, "alice")).unwrap();
        let first = sessions.start(named(Role::Reader, "bob")).unwrap();
        assert_eq!(sessions.session(&first), Some(named(Role::Reader, "bob")));
        assert_eq!(sessions.session("forged"), None);
        for _ in 0..SESSIONS_PER_TOKEN + 10 {
            sessions.start(named(Role::Reader, "bob")).unwrap();
        }
        assert_eq!(sessions.count(), SESSIONS_PER_TOKEN + 1);
        assert_eq!(sessions.session(&first), None, "bob's first was pushed out");
        assert!(sessions.session(&alice).is_some(), "alice's stays");
        let last = sessions.start(named(Role::Reader, "bob")).unwrap();
        sessions.end(&last);
        assert_eq!(sessions.session(&last), None);
        assert_eq!(
            sessions.end_everywhere(&named(Role::Reader, "bob")),
            SESSIONS_PER_TOKEN - 1
        );
        assert!(sessions.session(&alice).is_some(), "alice's stays");
    }
}
