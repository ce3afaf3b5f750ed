from ferry.cli.main import main

raise SystemExit(main())
