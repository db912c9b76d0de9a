//! troupe: the domain.
