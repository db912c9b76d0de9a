//! troupe-actors: reusable, LLM-free actor machinery.
