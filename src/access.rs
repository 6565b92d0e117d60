//! Who a token is: the admin listener's tokens (the shared operator and read tokens, the named
//! ones) and the role each gives, the same for the console's sign-in and the API's bearer.

use crate::config::{Secret, TokenRole};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The read token, or a named reader: looks only.
    Reader,
    /// The operator token, or a named operator: may act (in the console where
    /// `console_actions` is on).
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

impl From<TokenRole> for Role {
    fn from(role: TokenRole) -> Role {
        match role {
            TokenRole::Operator => Role::Operator,
            TokenRole::Reader => Role::Reader,
        }
    }
}

/// The token a request showed: its role, and its name where it is a named one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub role: Role,
    pub name: Option<String>,
}

impl Identity {
    /// Which token this is, as a session cap and "sign out everywhere" group them: a named
    /// token by its name, a shared one by its role (no name may hold a space).
    pub fn token_key(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => format!("shared {}", self.role.label()),
        }
    }
}

/// The admin listener's tokens.
pub struct Tokens {
    pub operator: Secret,
    pub read: Option<Secret>,
    /// `[[admin.tokens]]`: name, role, token.
    pub named: Vec<(String, TokenRole, Secret)>,
}

impl Tokens {
    /// Whose `token` is; every token is compared (in constant time), so the time taken does
    /// not say which one nearly matched.
    pub fn identify(&self, token: &str) -> Option<Identity> {
        let mut found = None;
        for (name, role, secret) in &self.named {
            if secret.matches(token) && found.is_none() {
                found = Some(Identity {
                    role: (*role).into(),
                    name: Some(name.clone()),
                });
            }
        }
        let shared = [
            (Some(&self.operator), Role::Operator),
            (self.read.as_ref(), Role::Reader),
        ];
        for (secret, role) in shared {
            if secret.is_some_and(|secret| secret.matches(token)) && found.is_none() {
                found = Some(Identity { role, name: None });
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_is_its_own_identity() {
        let tokens = Tokens {
            operator: Secret::new("op"),
            read: Some(Secret::new("rd")),
            named: vec![("alice".into(), TokenRole::Reader, Secret::new("al"))],
        };
        let alice = tokens.identify("al").unwrap();
        assert_eq!(
            (alice.role, alice.token_key()),
            (Role::Reader, "alice".into())
        );
        let operator = tokens.identify("op").unwrap();
        assert_eq!(operator.role, Role::Operator);
        assert_eq!(tokens.identify("rd").unwrap().role, Role::Reader);
        assert_eq!(tokens.identify("nope"), None);
        assert_eq!(tokens.identify(""), None);
    }
}
