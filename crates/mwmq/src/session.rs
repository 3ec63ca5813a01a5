//! A client connection as the commands see it, in either engine (the
//! engines' connections and the page's logins implement it).

use std::sync::Arc;

use crate::users::User;

/// A client connection as the commands see it, in either engine.
pub trait Session {
    /// Unique per process (`CLIENT ID`).
    fn id(&self) -> u64;
    /// The name given with `CLIENT SETNAME`.
    fn name(&self) -> Option<String>;
    /// Sets the name.
    fn set_name(&self, name: String);
    /// The user it logged in as.
    fn user(&self) -> Option<Arc<User>>;
    /// It logged in as `user`.
    fn set_user(&self, user: Arc<User>);
    /// Whether replies are encoded in RESP3.
    fn resp3(&self) -> bool;
    /// Switches the protocol of the replies that follow.
    fn set_resp3(&self, on: bool);
    /// Its failed logins.
    fn attempts(&self) -> &crate::users::Attempts;
    /// The client's address (failed logins are throttled by it).
    fn peer(&self) -> Option<std::net::IpAddr>;
    /// Who it is as a sender and a receiver: the user it logged in as, else
    /// the name it gave itself (`CLIENT SETNAME`: only without users).
    fn identity(&self) -> Option<String> {
        match self.user() {
            Some(u) => Some(u.name.clone()),
            None => self.name(),
        }
    }
}
