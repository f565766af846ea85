//! `lamina devices`: the adapters wgpu sees and the limits that decide what
//! each can run (largest buffer, largest storage binding, f16, subgroups).

use crate::inspect::human_size;

pub fn run(json: bool) -> anyhow::Result<()> {
    let adapters = lamina_gpu::list_adapters();
    if json {
        println!("{}", serde_json::to_string_pretty(&adapters)?);
        return Ok(());
    }
    if adapters.is_empty() {
        println!(
            "no GPU adapter found. For a software Vulkan device (lavapipe) on Debian or Ubuntu: \
             apt-get install mesa-vulkan-drivers libvulkan1"
        );
        return Ok(());
    }
    for a in &adapters {
        println!(
            "[{}] {} ({}, {})",
            a.index, a.name, a.backend, a.device_type
        );
        println!(
            "    driver                      {} {}",
            a.driver, a.driver_info
        );
        println!("    compute shaders             {}", yes(a.compute));
        println!(
            "    max buffer size             {}",
            human_size(a.max_buffer_size)
        );
        println!(
            "    max storage binding size    {}",
            human_size(a.max_storage_buffer_binding_size)
        );
        println!(
            "    workgroup                   x ≤ {}, ≤ {} invocations, {} shared memory",
            a.max_compute_workgroup_size_x,
            a.max_compute_invocations_per_workgroup,
            human_size(a.max_compute_workgroup_storage_size.into())
        );
        match (a.free_memory, a.device_memory) {
            (Some(free), Some(size)) => println!(
                "    free device memory          {} of {} (the driver's budget)",
                human_size(free),
                human_size(size)
            ),
            _ => println!("    free device memory          not reported by the driver"),
        }
        println!("    shader f16                  {}", yes(a.shader_f16));
        if a.subgroups {
            println!(
                "    subgroups                   yes, size {}..{}",
                a.subgroup_min_size, a.subgroup_max_size
            );
        } else {
            println!("    subgroups                   no");
        }
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
