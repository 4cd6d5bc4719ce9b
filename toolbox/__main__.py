from toolbox.run import main

raise SystemExit(main())
