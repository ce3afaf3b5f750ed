"""The handler contract: what a handler gets (``context``), raises and streams, and how
one is found."""
