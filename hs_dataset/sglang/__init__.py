"""Everything SGLang: the client that captures from it, the server side that runs inside it, launching it, and the legacy source patch."""
