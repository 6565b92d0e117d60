//! Who the command line acts as, for the jobs' history.

use sume_receiver::ledger::Actor;
use sume_receiver::logging::Escaped;

/// Who the command line acts as, for the jobs' history: `cli:<user>` (the user behind sudo,
/// where there is one), for `reason` if one is given.
pub(super) fn actor(reason: Option<&str>) -> Actor {
    Actor::because(&name(), reason)
}

/// `cli:<user> (uid N)`.
fn name() -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = ["SUDO_USER", "USER", "LOGNAME"]
        .into_iter()
        .find_map(|key| std::env::var(key).ok().filter(|name| !name.is_empty()))
        .or_else(|| user_name(uid));
    match name {
        Some(name) => format!("cli:{} (uid {uid})", Escaped(&name)),
        None => format!("cli:uid {uid}"),
    }
}

/// The user name of `uid` in the password database (a service's environment, cron and
/// `systemd-run` often set no `USER`).
fn user_name(uid: libc::uid_t) -> Option<String> {
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buffer = vec![0 as libc::c_char; 4096];
    // SAFETY: getpwuid_r writes only into `entry` and `buffer` (of the length given), and sets
    // `found` to `&entry` or null; the name is read before either is dropped.
    let status = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if status != 0 || found.is_null() || entry.pw_name.is_null() {
        return None;
    }
    // SAFETY: a non-null pw_name from getpwuid_r is a NUL-terminated string inside `buffer`.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    Some(name.to_string_lossy().into_owned()).filter(|name| !name.is_empty())
}
