from pflash_proxy.cli import main

raise SystemExit(main())
