"""Programs: evolve blocks and frozen parts, the edits and directives of a reply, and the prompts that ask for
them; shared by the search and the fast path, and importing neither."""
