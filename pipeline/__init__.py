"""stepguard services and glue: settings, broker and archive access, exporters, CLI."""
