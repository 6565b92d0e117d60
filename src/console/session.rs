//! Console sessions: a token typed once becomes an HttpOnly cookie naming a session held here,
//! each for [`SESSION_LIFETIME`], at most [`SESSIONS_PER_TOKEN`] per token: a sign-in pushes
//! out its own token's oldest session, never another token's.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::access::Identity;

/// How long a sign-in lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions one token holds at once (browsers, machines); the sessions held together are at
/// most this times the number of tokens, which the config bounds.
pub const SESSIONS_PER_TOKEN: usize = 32;

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
