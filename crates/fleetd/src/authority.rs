//! Which `Host` and `Origin` a request to this gateway may carry (the DNS-rebinding defence),
//! decided without a request: an authority (host and port) is allowed only if it equals one of
//! the gateway's own exactly — loopback at the port it listens on, its advertised URL's, the
//! address it is bound to — and an `Origin` may change state only if it is the very origin the
//! request was made to (the web view's own page).
//!
//! Everything here is parsed strictly: a value with a path, user info, spaces, or a port that is
//! not a number is no authority at all, and so never allowed.

/// An authority: a host (lowercase; an IPv6 address without its brackets) and a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    host: String,
    port: u16,
}

/// The port a scheme's URL means when it names none.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl Authority {
    /// An authority from its parts.
    pub fn new(host: &str, port: u16) -> Self {
        Self {
            host: host.trim_matches(['[', ']']).to_ascii_lowercase(),
            port,
        }
    }

    /// Parses `host[:port]` (IPv6 in brackets), the port `default` when it names none; `None`
    /// when it is not an authority.
    pub fn parse(text: &str, default: u16) -> Option<Self> {
        let (host, port) = split_port(text)?;
        Some(Self::new(host, port.unwrap_or(default)))
    }

    /// The authority of an `Origin` value (`scheme://host[:port]`, nothing after), with its
    /// scheme; `None` for `null`, another scheme, or anything more or less than an origin.
    fn of_origin(origin: &str) -> Option<(&str, Self)> {
        let (scheme, rest) = origin.split_once("://")?;
        let scheme_port = default_port(scheme)?;
        Some((scheme, Self::parse(rest, scheme_port)?))
    }

    /// The authority of a URL (`advertise_url`), if it has a host.
    pub fn of_url(url: &url::Url) -> Option<Self> {
        Some(Self::new(url.host_str()?, url.port_or_known_default()?))
    }
}

/// Splits `host[:port]` (IPv6 in brackets) into a host and its port, if it names one; `None`
/// when it is not an authority (a path, user info, spaces, a port that is not a number).
fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        if host.is_empty() || !host.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return None;
        }
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        None => None,
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            Some(port.parse().ok()?)
        }
        Some(_) => return None,
    };
    let named = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'));
    named.then_some((host, port))
}

/// The authorities requests to this gateway may name.
#[derive(Clone, Debug)]
pub struct AllowedHosts(Vec<Authority>);

/// Why a request's `Host` or `Origin` is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The `Host` is none of this gateway's authorities.
    Host,
    /// The `Origin` is none of this gateway's own.
    Origin,
    /// The `Origin` is one of the gateway's authorities but not the one the request was made
    /// to, and the request would change state.
    CrossOrigin,
}

impl AllowedHosts {
    /// The loopback authorities at `port`, plus `extra`.
    pub fn new(port: u16, extra: impl IntoIterator<Item = Authority>) -> Self {
        let mut allowed: Vec<Authority> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(|host| Authority::new(host, port))
            .collect();
        for authority in extra {
            if !allowed.contains(&authority) {
                allowed.push(authority);
            }
        }
        Self(allowed)
    }

    fn allows(&self, authority: &Authority) -> bool {
        self.0.contains(authority)
    }

    /// Whether a `Host` value names one of ours. A `Host` without a port names the default
    /// port of the scheme the request came in on, which fleetd cannot see behind a TLS proxy:
    /// it names ours if we have that host at port 80 or 443.
    fn allows_host(&self, host: &str) -> Option<Authority> {
        let (name, port) = split_port(host)?;
        let ports: &[u16] = match port {
            Some(port) => &[port],
            None => &[80, 443],
        };
        ports
            .iter()
            .map(|port| Authority::new(name, *port))
            .find(|authority| self.allows(authority))
    }

    /// Checks a request's `Host` (absent: refused, as HTTP/1.1 requires one) and `Origin`
    /// (absent: not a browser's cross-site request), and whether it `changes` state.
    pub fn check(
        &self,
        host: Option<&str>,
        origin: Option<&str>,
        changes: bool,
    ) -> Result<(), Refused> {
        let host = host
            .and_then(|host| self.allows_host(host.trim()))
            .ok_or(Refused::Host)?;
        let Some(origin) = origin else {
            return Ok(());
        };
        let (_, origin) = Authority::of_origin(origin.trim())
            .filter(|(_, origin)| self.allows(origin))
            .ok_or(Refused::Origin)?;
        if changes && origin != host {
            return Err(Refused::CrossOrigin);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> AllowedHosts {
        AllowedHosts::new(
            8765,
            [
                Authority::new("Gateway.Example", 443),
                Authority::new("[fe80::1]", 9000),
            ],
        )
    }

    #[test]
    fn a_host_must_equal_an_allowed_authority_with_its_port() {
        let allowed = allowed();
        for ok in [
            "127.0.0.1:8765",
            "localhost:8765",
            "LOCALHOST:8765",
            "[::1]:8765",
            "gateway.example:443",
            // Behind a TLS proxy that keeps the Host: port 443, which fleetd cannot see.
            "gateway.example",
            "[fe80::1]:9000",
        ] {
            assert_eq!(allowed.check(Some(ok), None, true), Ok(()), "{ok}");
        }
        for bad in [
            // The prefix of the issue: everything before the first ':' was compared.
            "localhost:80.evil.example",
            "localhost:8765.evil.example",
            "127.0.0.1:8766",
            "localhost",
            "localhost:",
            "localhost:+8765",
            "localhost:08765x",
            "evil.example",
            "127.0.0.2:8765",
            "localhost.evil.example:8765",
            "gateway.example:80",
            "[::1]",
            "[::1]8765",
            "[fe80::1]:8765",
            "user@localhost:8765",
            "localhost:8765/path",
            "local host:8765",
            "",
        ] {
            assert_eq!(
                allowed.check(Some(bad), None, false),
                Err(Refused::Host),
                "{bad}"
            );
        }
        assert_eq!(allowed.check(None, None, false), Err(Refused::Host));
    }

    #[test]
    fn a_port_of_the_default_is_the_same_authority() {
        let allowed = AllowedHosts::new(80, []);
        assert_eq!(allowed.check(Some("localhost"), None, true), Ok(()));
        assert_eq!(allowed.check(Some("localhost:80"), None, true), Ok(()));
        assert_eq!(
            allowed.check(Some("localhost"), Some("http://localhost"), true),
            Ok(())
        );
        // https://localhost is port 443: another origin.
        assert_eq!(
            allowed.check(Some("localhost"), Some("https://localhost"), false),
            Err(Refused::Origin)
        );
    }

    #[test]
    fn an_origin_must_be_one_of_ours_and_only_our_own_may_change_state() {
        let allowed = allowed();
        let host = Some("127.0.0.1:8765");
        // The web view's own page.
        assert_eq!(
            allowed.check(host, Some("http://127.0.0.1:8765"), true),
            Ok(())
        );
        // Any other loopback port is another origin (another program's page).
        for bad in [
            "http://localhost:3000",
            "http://127.0.0.1:8766",
            "http://127.0.0.1",
            "https://evil.example",
            "http://localhost:8765.evil.example",
            "http://127.0.0.1:8765/ui",
            "null",
            "file://localhost",
            "127.0.0.1:8765",
            "",
        ] {
            assert_eq!(
                allowed.check(host, Some(bad), false),
                Err(Refused::Origin),
                "{bad}"
            );
        }
        // One of our authorities, but not the one asked: it may read, never change.
        assert_eq!(
            allowed.check(host, Some("http://localhost:8765"), false),
            Ok(())
        );
        assert_eq!(
            allowed.check(host, Some("http://localhost:8765"), true),
            Err(Refused::CrossOrigin)
        );
        assert_eq!(
            allowed.check(
                Some("gateway.example:443"),
                Some("https://gateway.example"),
                true
            ),
            Ok(())
        );
    }

    #[test]
    fn a_url_names_its_authority_with_the_schemes_port() {
        let url = |s: &str| url::Url::parse(s).unwrap();
        assert_eq!(
            Authority::of_url(&url("http://host.containers.internal/mcp")),
            Some(Authority::new("host.containers.internal", 80))
        );
        assert_eq!(
            Authority::of_url(&url("https://[fe80::1]:9000/mcp")),
            Some(Authority::new("fe80::1", 9000))
        );
    }
}
